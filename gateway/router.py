"""Pick an endpoint: alias → version → live, ready, unsuppressed endpoints.

Candidates are the live leases for the version (plus the declared engines when
`registry.require_lease` is off), minus endpoints this replica ejected after
consecutive failures (`outlier.OutlierDetector`, Envoy's outlier detection) —
the local ejection covers the window before the lapsed lease removes them
everywhere. Ejection is per `(instance_id, generation)`, so a restarted
instance (new generation) is routable at once.

The router also does the request accounting the retry budget needs:
`begin()`/`end()` around every request, `try_retry()`/`end_retry()` around
every migration in flight.

Among candidates with a free slot: least outstanding requests; with a client
key (`user` or `X-Client-Id`), consistent hashing (uhashring's ketama ring)
with bounded load: walk the ring from the key and take the first endpoint
whose load is under `hash_load_factor` × mean (Mirrokni et al. 2018), so one
hot client cannot pin an engine.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from uhashring import HashRing

from common.clock import Clock
from common.logs import get_logger
from contract.lease import Lease, LeaseRegistry
from gateway.admission import Admission
from gateway.errors import NoHealthyEndpoint, Overloaded
from gateway.outlier import OutlierDetector
from gateway.routing_table import RoutingTable
from gateway.settings import GatewaySettings

log = get_logger(__name__)


@dataclass(frozen=True)
class Endpoint:
    instance_id: str
    generation: int | None  # None: a declared engine without a lease; learnt from its responses
    url: str
    version: str
    zone: str

    @property
    def key(self) -> tuple[str, int | None]:
        return (self.instance_id, self.generation)


class LeaseView:
    """The live leases as this replica last read them; Redis is re-read in the background."""

    def __init__(self, registry: LeaseRegistry, *, refresh_interval: float, cached: bool) -> None:
        self.registry = registry
        self.refresh_interval = refresh_interval
        self.cached = cached
        self.leases: list[Lease] = []
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        if self.cached:
            self.leases = await self.registry.live()
            self._task = asyncio.create_task(self._refresh_loop(), name="lease-view-refresh")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_interval)
            try:
                self.leases = await self.registry.live()
            except Exception as exc:  # keep the last good view; the registry may be back next tick
                log.warning("lease view refresh failed", error=str(exc))

    async def current(self) -> list[Lease]:
        if self.cached:
            return self.leases
        return await self.registry.live()


class Router:
    def __init__(self, settings: GatewaySettings, table: RoutingTable, view: LeaseView, admission: Admission, clock: Clock) -> None:
        self.settings = settings
        self.table = table
        self.view = view
        self.admission = admission
        self.clock = clock
        self.outliers = OutlierDetector(settings.outlier, clock)
        self.on_ejected: Callable[[Endpoint, str], None] | None = None  # L7 event hook (gateway/l7_events.py)
        self._rings: dict[frozenset[str], HashRing] = {}

    async def _routable(self, version: str) -> list[Endpoint]:
        found: dict[str, Endpoint] = {}
        for lease in await self.view.current():
            if lease.version == version:
                found[lease.instance_id] = Endpoint(lease.instance_id, lease.generation, lease.url, lease.version, lease.zone)
        if not self.settings.registry.require_lease:
            for engine in self.table.declared_engines(version):
                found.setdefault(engine.instance_id, Endpoint(engine.instance_id, None, engine.url, engine.version, engine.zone))
        return list(found.values())

    async def endpoints(self, version: str) -> list[Endpoint]:
        """Live, ready endpoints of `version` that this replica has not ejected."""
        return [e for e in await self._routable(version) if not self.outliers.ejected(e.key)]

    async def is_live(self, endpoint: Endpoint) -> bool:
        """Whether the endpoint's lease (this generation) is still live; a declared engine without one always is."""
        if endpoint.generation is None:
            return True
        return any(lease.instance_id == endpoint.instance_id and lease.generation == endpoint.generation
                   for lease in await self.view.current())

    async def failed(self, endpoint: Endpoint, reason: str) -> bool:
        """Count a failure of `endpoint` (an `EngineFailure.reason`); True if it is now ejected."""
        peers = [e.key for e in await self._routable(endpoint.version)]
        if endpoint.key not in peers:
            peers.append(endpoint.key)
        was_ejected = self.outliers.ejected(endpoint.key)
        ejected = self.outliers.failure(endpoint.key, reason, peers=peers)
        if ejected and not was_ejected and self.on_ejected is not None:
            self.on_ejected(endpoint, reason)
        return ejected

    def succeeded(self, endpoint: Endpoint) -> None:
        self.outliers.success(endpoint.key)

    # -- request accounting for the retry budget ---------------------------------------
    def begin(self) -> None:
        self.admission.retry_budget.active_requests += 1

    def end(self) -> None:
        self.admission.retry_budget.active_requests -= 1

    def try_retry(self) -> bool:
        """A migration starts: take a token of the retry budget (concurrent retries, as Envoy's) if one is free."""
        return self.admission.retry_budget.try_acquire()

    async def begin_retry(self, timeout: float) -> bool:
        """A migration starts: take a retry token, waiting up to `timeout` for another migration to end."""
        return await self.admission.retry_budget.acquire(timeout)

    def end_retry(self) -> None:
        """The migration is over: its continuation's first token arrived, or the stream ended."""
        self.admission.retry_budget.release()

    async def acquire(self, version: str, *, client_key: str | None, queue_timeout: float,
                      prefer: str | None = None) -> Endpoint:
        """Take a slot on an endpoint, waiting in the bounded queue if all are busy.

        `prefer`: an instance id to take if it is routable and has room (drills pin the first attempt).
        """
        deadline = self.clock.now() + queue_timeout
        while True:
            candidates = await self.endpoints(version)
            if prefer is not None:
                for endpoint in candidates:
                    if endpoint.instance_id == prefer and self.admission.has_room(prefer):
                        self.admission.take(prefer)
                        return endpoint
            if not candidates:
                raise NoHealthyEndpoint(f"no live, ready engine serves {version!r}", retry_after_s=self.settings.admission.retry_after.total_seconds())
            chosen = self._pick(candidates, client_key)
            if chosen is not None:
                self.admission.take(chosen.instance_id)
                return chosen
            remaining = deadline - self.clock.now()
            if self.admission.queue_full() or remaining <= 0:
                raise Overloaded(
                    f"every engine for {version!r} is at its concurrency limit and the queue is full",
                    retry_after_s=self.settings.admission.retry_after.total_seconds(),
                )
            if not await self.admission.wait_for_slot(remaining):
                raise Overloaded(
                    f"no engine slot for {version!r} within {queue_timeout:.1f}s",
                    retry_after_s=self.settings.admission.retry_after.total_seconds(),
                )

    async def release(self, endpoint: Endpoint) -> None:
        await self.admission.give_back(endpoint.instance_id)

    def _pick(self, candidates: list[Endpoint], client_key: str | None) -> Endpoint | None:
        free = [e for e in candidates if self.admission.has_room(e.instance_id)]
        if not free:
            return None
        if client_key is None:
            least = min(self.admission.outstanding[e.instance_id] for e in free)
            return random.choice([e for e in free if self.admission.outstanding[e.instance_id] == least])
        by_id = {e.instance_id: e for e in candidates}
        names = frozenset(by_id)
        ring = self._rings.get(names)
        if ring is None:
            ring = self._rings[names] = HashRing(nodes=sorted(names))
        total = sum(self.admission.outstanding[n] for n in names) + 1
        bound = math.ceil(self.settings.admission.hash_load_factor * total / len(names))
        for node in ring.range(client_key, unique=True):
            name = node["nodename"]
            if self.admission.has_room(name) and self.admission.outstanding[name] < bound:
                return by_id[name]
        return None
