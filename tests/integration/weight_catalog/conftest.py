"""moto's S3 emulator for the catalog's S3 artifact-store tests.

The database fixtures every catalog test uses live in tests/integration/conftest.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[Any]:
    """moto's S3 emulator over real HTTP, one process for the session."""
    from lifeline.daemons import MotoServer

    server = MotoServer()
    server.start()
    yield server
    server.stop()
