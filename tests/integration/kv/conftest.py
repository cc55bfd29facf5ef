"""moto's S3 emulator (AWS emulated, a real HTTP server) and a Redis key prefix for the KV store tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[Any]:
    from lifeline.daemons import MotoServer

    server = MotoServer()
    server.start()
    yield server
    server.stop()
