"""Injected time, one protocol for every process.

Domain code asks a `Clock`, never `time.time()` or `datetime.now()`, so tests
run on virtual time (`ManualClock`). Three readings of one clock:

    now()     monotonic seconds: timeouts, TTLs, durations inside one process
    wall()    Unix seconds: deadlines another replica or process must read
    utcnow()  aware UTC datetime: timestamps stored in the database
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds."""
        ...

    def wall(self) -> float:
        """Unix seconds."""
        ...

    def utcnow(self) -> datetime:
        """The wall clock as an aware UTC datetime."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def utcnow(self) -> datetime:
        return datetime.now(UTC)


class ManualClock:
    """Virtual time for tests: moves only when told to, all three readings together."""

    WALL_AT_START = datetime(2026, 1, 1, tzinfo=UTC)

    def __init__(self, start: float = 1000.0) -> None:
        self.start = start
        self.t = start

    def now(self) -> float:
        return self.t

    def wall(self) -> float:
        return self.WALL_AT_START.timestamp() + (self.t - self.start)

    def utcnow(self) -> datetime:
        return self.WALL_AT_START + timedelta(seconds=self.t - self.start)

    def advance(self, delta: float | timedelta) -> None:
        self.t += delta.total_seconds() if isinstance(delta, timedelta) else delta
