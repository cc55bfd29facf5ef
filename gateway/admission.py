"""Overload is refused, not queued to death.

Each engine takes at most `max_concurrency_per_engine` streams from this
replica; beyond that a request waits in a bounded queue for at most
`queue_timeout`, and beyond the queue it is refused at once with `429`,
`Retry-After` and `{"error": {"type": "overloaded"}}`. Migrations draw from a
retry budget, as Envoy's: retries in flight may not exceed `ratio` × active
requests (but at least `min`), so a failing fleet is not hammered by its own
recovery traffic. A retry is in flight from the failure until the
continuation's first token. Unlike Envoy, a migration over the budget waits
(up to `queue_timeout`, within its deadline) for a retry to end instead of
failing at once: one engine's death fails several streams in the same
instant, and pacing their recovery keeps the bound without losing them.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field

from gateway.settings import AdmissionConfig


@dataclass
class RetryBudget:
    ratio: float
    minimum: int
    active_requests: int = 0
    active_retries: int = 0
    freed: asyncio.Event = field(default_factory=asyncio.Event)  # set (and replaced) whenever a retry ends

    def allowed(self) -> int:
        return max(self.minimum, int(self.ratio * self.active_requests))

    def try_acquire(self) -> bool:
        if self.active_retries >= self.allowed():
            return False
        self.active_retries += 1
        return True

    def release(self) -> None:
        self.active_retries = max(0, self.active_retries - 1)
        self.freed.set()
        self.freed = asyncio.Event()

    async def acquire(self, timeout: float) -> bool:
        """A retry token, waiting up to `timeout` seconds for one to be released; False if none came."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.try_acquire():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self.freed.wait(), remaining)
            except TimeoutError:
                return False
        return True


class Admission:
    """Per-engine slots and the bounded wait queue; all on the event loop, no threads."""

    def __init__(self, config: AdmissionConfig) -> None:
        self.config = config
        self.outstanding: dict[str, int] = defaultdict(int)  # by instance id
        self.waiting = 0
        self.retry_budget = RetryBudget(config.retry_budget_ratio, config.retry_budget_min)
        self._slot_freed = asyncio.Condition()

    def has_room(self, instance_id: str) -> bool:
        return self.outstanding[instance_id] < self.config.max_concurrency_per_engine

    def take(self, instance_id: str) -> None:
        self.outstanding[instance_id] += 1

    async def give_back(self, instance_id: str) -> None:
        self.outstanding[instance_id] = max(0, self.outstanding[instance_id] - 1)
        async with self._slot_freed:
            self._slot_freed.notify_all()

    def queue_full(self) -> bool:
        return self.waiting >= self.config.max_queue

    async def wait_for_slot(self, timeout: float) -> bool:
        """Wait in the queue until some slot frees; False on timeout."""
        self.waiting += 1
        try:
            async with self._slot_freed:
                await asyncio.wait_for(self._slot_freed.wait(), timeout)
            return True
        except TimeoutError:
            return False
        finally:
            self.waiting -= 1
