"""The gateway's embedded lease registry (one process, no Redis).

The record, the errors and the Redis registry live in `contract.lease`; this
is the same `LeaseRegistry` protocol kept in the gateway's memory, which
engines reach through the gateway's authenticated lease endpoint. Expiry is
computed when read, from the injected clock.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

from common.clock import Clock, SystemClock
from contract.lease import Lease, LeaseExpired, Registration, StaleGeneration


class InMemoryLeaseRegistry:
    def __init__(self, ttl: timedelta = timedelta(seconds=2), clock: Clock | None = None) -> None:
        self.ttl = ttl
        self.clock = clock or SystemClock()
        self._generations: dict[str, int] = {}
        self._leases: dict[str, Lease] = {}
        self._deadlines: dict[str, float] = {}  # monotonic; Lease.expires_at is the wall-clock copy
        self._lock = asyncio.Lock()

    def _stamp(self, lease: Lease) -> Lease:
        ttl = self.ttl.total_seconds()
        self._deadlines[lease.instance_id] = self.clock.now() + ttl
        stamped = replace(lease, expires_at=self.clock.wall() + ttl)
        self._leases[lease.instance_id] = stamped
        return stamped

    def _is_live(self, instance_id: str) -> bool:
        return self._deadlines.get(instance_id, 0.0) > self.clock.now()

    async def register(self, registration: Registration) -> Lease:
        async with self._lock:
            generation = self._generations.get(registration.instance_id, 0) + 1
            self._generations[registration.instance_id] = generation
            return self._stamp(Lease(registration.instance_id, generation, registration.url, registration.version,
                                     registration.zone, registration.region))

    async def renew(self, instance_id: str, generation: int) -> Lease:
        async with self._lock:
            current = self._generations.get(instance_id, 0)
            if generation < current:
                raise StaleGeneration(f"{instance_id} generation {generation} is older than {current}")
            lease = self._leases.get(instance_id)
            if lease is None or generation != lease.generation or not self._is_live(instance_id):
                raise LeaseExpired(f"{instance_id} generation {generation} has no live lease; register again")
            return self._stamp(lease)

    async def release(self, instance_id: str, generation: int) -> None:
        async with self._lock:
            lease = self._leases.get(instance_id)
            if lease is not None and lease.generation == generation:
                del self._leases[instance_id]
                del self._deadlines[instance_id]

    async def live(self) -> list[Lease]:
        return sorted((lease for lease in self._leases.values() if self._is_live(lease.instance_id)),
                      key=lambda lease: lease.instance_id)

    async def close(self) -> None:
        return None
