"""Real routing daemons for the cutover driver tests (tests/support/daemons.py).

Each fixture starts its daemon in the test's temp dir on spare loopback
ports and stops it by pid at teardown; a daemon that is not installed
fails the test naming its package.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cutover.drivers.dns import EXTERNAL_TTL_S, INTERNAL_TTL_S
from tests.support.daemons import BindServer, DnsRecord

# The seed's dual TTL: the external record moves at cutover, the internal one does not.
REGION_A = "192.0.2.10"
REGION_B = "198.51.100.10"


@pytest.fixture
def bind_server(tmp_path: Path) -> Iterator[BindServer]:
    server = BindServer(workdir=tmp_path / "bind", records=[
        DnsRecord("api", EXTERNAL_TTL_S, "A", REGION_A),
        DnsRecord("api.internal", INTERNAL_TTL_S, "A", REGION_A),
    ])
    try:
        yield server.start()
    finally:
        server.stop()
