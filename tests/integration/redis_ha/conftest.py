"""A real Redis Sentinel lab per test: primary + replica + 3 sentinels (quorum 2, down-after 1 s)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lifeline.daemons import RedisSentinelLab


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[RedisSentinelLab]:
    started = RedisSentinelLab(tmp_path / "sentinel-lab").start()
    try:
        # Replicas linked and synced first: a registration's WAIT 1 must not race the initial sync.
        started.wait_settled()
        yield started
    finally:
        started.stop()
