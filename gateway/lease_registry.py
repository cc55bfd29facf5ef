"""The gateway's embedded lease registry (one process, no Redis).

The record, the errors and the Redis registry live in `contract.lease`; this
is the same `LeaseRegistry` protocol kept in the gateway's memory, which
engines reach through the gateway's authenticated lease endpoint. Expiry is
computed when read, from the injected clock.

Leases die with the process (engines re-register within a TTL), but
generations must not: an engine that re-registers after a gateway restart
must get a generation above every one it had, or a late frame or renewal of
its old process would be taken as current (invariant 1). `GenerationCounters`
keeps them growing across restarts in one of two ways:

- `state_path` set (`registry.state_dir`): the counters are a small JSON file,
  replaced atomically and fsynced *before* the new generation is handed out.
  A file that cannot be read stops start-up: guessing would risk going back.
- no state path: derived from the boot time, `max(last + 1, wall-clock ms at
  start)`. It needs no disk and grows across restarts as long as the wall
  clock does not step back across the restart and a process hands out fewer
  registrations than milliseconds it lived (engines register once per boot
  or lapse). The numbers are large (≈1.8e12) but opaque; +1 within a process.
  Redis's `INCR` counter (`contract.lease`) needs neither.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from common.clock import Clock, SystemClock
from common.logs import get_logger
from contract.lease import Lease, LeaseExpired, Registration, StaleGeneration
from common.atomic_file import write_atomically

log = get_logger(__name__)


class GenerationCounters:
    """Per-instance generation counters that never go back, even across gateway restarts."""

    def __init__(self, clock: Clock, state_path: Path | None = None) -> None:
        self.clock = clock
        self.state_path = state_path
        self._last: dict[str, int] = {}
        self._boot_floor = int(clock.wall() * 1000)
        if state_path is not None and state_path.exists():
            try:
                loaded = json.loads(state_path.read_bytes())["generations"]
                self._last = {str(k): int(v) for k, v in loaded.items()}
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ValueError(f"registry.state_dir: cannot read generation counters {state_path}: {exc!r}; "
                                 "fix or remove the file (removing it lets generations restart at 1)") from None
            log.info("generation counters loaded", path=str(state_path), instances=len(self._last))

    def current(self, instance_id: str) -> int:
        return self._last.get(instance_id, 0)

    async def next(self, instance_id: str) -> int:
        """The next generation of `instance_id`, durable before it is returned. Callers serialise."""
        last = self._last.get(instance_id, 0)
        if self.state_path is None:
            generation = max(last + 1, self._boot_floor)
            self._last[instance_id] = generation
            return generation
        generation = last + 1
        updated = {**self._last, instance_id: generation}
        body = json.dumps({"generations": updated}, sort_keys=True).encode()
        await asyncio.to_thread(write_atomically, self.state_path, body)
        self._last = updated
        return generation


class InMemoryLeaseRegistry:
    def __init__(self, ttl: timedelta = timedelta(seconds=2), clock: Clock | None = None, *,
                 state_path: Path | None = None) -> None:
        self.ttl = ttl
        self.clock = clock or SystemClock()
        self._generations = GenerationCounters(self.clock, state_path)
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
            generation = await self._generations.next(registration.instance_id)
            return self._stamp(Lease(registration.instance_id, generation, registration.url, registration.version,
                                     registration.zone, registration.region, sampling=registration.sampling))

    async def renew(self, instance_id: str, generation: int) -> Lease:
        async with self._lock:
            current = self._generations.current(instance_id)
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
