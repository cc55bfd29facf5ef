"""Pick an endpoint: alias → version → live, ready, unsuppressed endpoints.

Candidates are the live leases for the version (plus the declared engines when
`registry.require_lease` is off), minus endpoints this replica ejected after
consecutive failures (`outlier.OutlierDetector`, Envoy's outlier detection) —
the local ejection covers the window before the lapsed lease removes them
everywhere. Ejection is per `(instance_id, generation)`, so a restarted
instance (new generation) is routable at once.

A request's continuation goes to an endpoint that has not failed it
(`avoid`: those that did, earliest first, the one that just failed it last)
and to one that has only when no other is routable — Envoy's
`previous_hosts` retry predicate falls back the same way — so one transient
500 on each of two engines costs a request nothing, and a survivor that was
slow to accept a connection on a loaded machine is tried again rather than
given up. Whether an endpoint that failed is still routable at all is the
outlier detector's judgment: a refused or reset connection ejects it, a
timeout or a 5xx does not eject the last one. When only ejected endpoints
are left there is nothing to wait for — no slot frees up on an engine we
will not use — so it is `no_healthy_endpoint` at once, as for a version with
no engine; a restarted instance is a new generation, a new key, and routable
again. When every routable endpoint is held out because it streams no token
ids, it is `engine_incompatible` (502): waiting or retrying would not help.

The router also does the request accounting the retry budget needs:
`begin()`/`end()` around every request, `try_retry()`/`end_retry()` around
every migration in flight.

The regional agent's verdicts (`gateway/verdicts.py`, `contract.verdict`)
narrow the candidates further: an endpoint it ejected (timeout, error,
wrong_output) or that takes no new sessions (draining, old_generation) is
not a candidate; one it found `overloaded` is de-weighted.

Among candidates with a free slot: the least (outstanding + 1) ÷ weight,
weight 1, or `admission.overloaded_weight` for a de-weighted endpoint; with a
client key (`user` or `X-Client-Id`), consistent hashing (rendezvous:
`rendezvous_order`) with bounded load: walk the endpoints in the key's
order and take the first one whose load is under `hash_load_factor` × mean
× weight (Mirrokni et al. 2018), so one hot client cannot pin an engine;
when none is, the first
under the unweighted bound, so a de-weighted endpoint with room still beats
a full queue.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

from common.clock import Clock, SystemClock
from common.logs import get_logger
from contract.lease import Lease, LeaseRegistry
from contract.sampling import Sampling
from gateway.admission import Admission
from contract.engine_support import missing_token_ids
from gateway.errors import EngineIncompatible, NoHealthyEndpoint, Overloaded
from gateway.outlier import EndpointKey, OutlierDetector
from gateway.routing_table import RoutingTable
from gateway.settings import GatewaySettings
from gateway.verdicts import VerdictView

log = get_logger(__name__)


@dataclass(frozen=True)
class Endpoint:
    instance_id: str
    generation: int | None  # None: a declared engine without a lease; learnt from its responses
    url: str
    version: str
    zone: str
    sampling: str = Sampling.ENGINE_DEFAULT.value  # contract/sampling.py, from its lease

    @property
    def key(self) -> tuple[str, int | None]:
        return (self.instance_id, self.generation)


class NoExactContinuation(NoHealthyEndpoint):
    """Engines are routable, but none can redraw this sampled stream's tokens (contract/sampling.py)."""

    error_type = "not_resumable"


class LeaseRegistryUnavailable(NoHealthyEndpoint):
    """The lease registry has not answered for longer than `registry.fail_static`: no new requests."""

    error_type = "lease_registry_unavailable"


class LeaseView:
    """The live leases as this replica last read them; Redis is re-read in the background.

    Fail static (Envoy keeps its last endpoints while its control plane is away;
    Kubernetes' EndpointSlices keep serving while the API server is down): when
    the registry cannot be read, the view keeps the leases it last saw and the
    router keeps routing to them, still ejecting endpoints that fail locally,
    for `fail_static` seconds after the last good read. After that window new
    requests (and migrations) get 503 `lease_registry_unavailable`, and the
    router never routes to an endpoint it knows nothing about; streams in
    flight continue. The next good read ends it all.

    Metrics: `lifeline_gateway_lease_registry_available` (0/1),
    `lifeline_gateway_lease_view_age_seconds` (since the last good read, set on
    every refresh), `lifeline_gateway_lease_registry_refused_total` (requests
    refused after the window). Log lines: "lease registry unreachable; routing
    on the last view (fail static)", "fail-static window over; refusing new
    requests", "lease registry back".
    """

    def __init__(self, registry: LeaseRegistry, *, refresh_interval: float, cached: bool,
                 fail_static: float = 30.0, clock: Clock | None = None,
                 metrics_registry: CollectorRegistry | None = None) -> None:
        self.registry = registry
        self.refresh_interval = refresh_interval
        self.cached = cached
        self.fail_static = fail_static
        self.clock: Clock = clock or SystemClock()
        self.leases: list[Lease] = []
        self.last_read_at: float | None = None  # clock.now() of the last good read
        self.available = True
        self._window_over_logged = False
        self._task: asyncio.Task | None = None
        r = metrics_registry or CollectorRegistry()
        self.m_available = Gauge("lifeline_gateway_lease_registry_available", "1 while the lease registry answers", registry=r)
        self.m_age = Gauge("lifeline_gateway_lease_view_age_seconds", "Seconds since the lease view was last read", registry=r)
        self.m_refused = Counter("lifeline_gateway_lease_registry_refused", "Requests refused: lease view older than fail_static", registry=r)
        self.m_available.set(1)

    async def start(self) -> None:
        if self.cached:
            await self.refresh()
            self._task = asyncio.create_task(self._refresh_loop(), name="lease-view-refresh")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def refresh(self) -> bool:
        """Read the registry once; on failure keep the last view. True if it answered."""
        try:
            leases = await self.registry.live()
        except Exception as exc:  # noqa: BLE001 - keep the last good view; the registry may be back next tick
            if self.available:
                log.error("lease registry unreachable; routing on the last view (fail static)",
                          error=(str(exc) or type(exc).__name__)[:200], endpoints=len(self.leases),
                          fail_static_s=self.fail_static)
            self.available = False
            self.m_available.set(0)
            self.m_age.set(self.age())
            return False
        if not self.available:
            log.warning("lease registry back", endpoints=len(leases), unavailable_for_s=round(self.age(), 3))
        self.leases, self.last_read_at, self.available = leases, self.clock.now(), True
        self._window_over_logged = False
        self.m_available.set(1)
        self.m_age.set(0)
        return True

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_interval)
            await self.refresh()

    def age(self) -> float:
        """Seconds since the last good read (infinite before the first)."""
        return math.inf if self.last_read_at is None else self.clock.now() - self.last_read_at

    def stale(self) -> bool:
        return self.cached and self.age() > self.fail_static

    def check_admission(self) -> None:
        """Raise LeaseRegistryUnavailable once the view is older than the fail-static window."""
        if not self.stale():
            return
        self.m_refused.inc()
        if not self._window_over_logged:
            self._window_over_logged = True
            log.error("fail-static window over; refusing new requests", age_s=round(self.age(), 3),
                      fail_static_s=self.fail_static)
        raise LeaseRegistryUnavailable(
            f"the lease registry has not answered for more than {self.fail_static:g}s; no endpoint is known to be live",
            retry_after_s=1.0)

    async def current(self) -> list[Lease]:
        if self.cached:
            return self.leases
        return await self.registry.live()


def _least_recently_failed(candidates: list[Endpoint], avoid: tuple[EndpointKey, ...]) -> list[Endpoint]:
    """The candidates not in `avoid`; if there are none, the first of them in `avoid` (the earliest failure)."""
    untried = [e for e in candidates if e.key not in avoid]
    if untried:
        return untried
    rank = {key: i for i, key in enumerate(avoid)}
    earliest = min(rank[e.key] for e in candidates)
    return [e for e in candidates if rank[e.key] == earliest]


def lease_view_of(view: object) -> LeaseView | None:
    """The LeaseView under a wrapper (the snapshot's view), if there is one."""
    while not isinstance(view, LeaseView):
        view = getattr(view, "inner", None)
        if view is None:
            return None
    return view


class Router:
    def __init__(self, settings: GatewaySettings, table: RoutingTable, view: LeaseView, admission: Admission, clock: Clock,
                 verdicts: VerdictView | None = None) -> None:
        self.settings = settings
        self.verdicts = verdicts  # the regional agent's board; None: leases and local ejection alone
        self.table = table
        self.view = view
        self.admission = admission
        self.clock = clock
        self.outliers = OutlierDetector(settings.outlier, clock)
        self.on_ejected: Callable[[Endpoint, str], None] | None = None  # L7 event hook (gateway/l7_events.py)
        self._leased: dict[str, tuple[list[Lease], dict[str, Endpoint]]] = {}  # version → (the view read, endpoints)

    async def _routable(self, version: str) -> list[Endpoint]:
        leases = await self.view.current()
        held = self._leased.get(version)
        if held is None or held[0] is not leases:  # a new view (each refresh, each snapshot) builds them once
            held = self._leased[version] = (leases, {
                lease.instance_id: Endpoint(lease.instance_id, lease.generation, lease.url, lease.version, lease.zone,
                                            lease.sampling)
                for lease in leases if lease.version == version})
        found = dict(held[1])
        if not self.settings.registry.require_lease:
            for engine in self.table.declared_engines(version):
                found.setdefault(engine.instance_id, Endpoint(engine.instance_id, None, engine.url, engine.version,
                                                              engine.zone, engine.sampling))
        return list(found.values())

    async def endpoints(self, version: str) -> list[Endpoint]:
        """Live, ready endpoints of `version` that this replica has not ejected and the agent lets take sessions."""
        return [e for e in await self._routable(version)
                if not self.outliers.ejected(e.key) and self._verdict(e) not in ("eject", "no_new_sessions")]

    def _verdict(self, endpoint: Endpoint) -> str | None:
        return self.verdicts.action(endpoint.key) if self.verdicts is not None else None

    def _weight(self, endpoint: Endpoint) -> float:
        return self.settings.admission.overloaded_weight if self._verdict(endpoint) == "deweight" else 1.0

    async def is_live(self, endpoint: Endpoint) -> bool:
        """Whether the endpoint's lease (this generation) is still live; a declared engine without one always is."""
        if endpoint.generation is None:
            return True
        return any(lease.instance_id == endpoint.instance_id and lease.generation == endpoint.generation
                   for lease in await self.view.current())

    async def left_routing(self, endpoint: Endpoint) -> str | None:
        """Why `endpoint` takes no new sessions any more (None while it does), from what this replica holds.

        The lease view and the verdict board are in memory here (re-read in the
        background), so this is cheap; streams ask it only when a token is late.
        """
        try:
            if not await self.is_live(endpoint):
                return "its lease was released or lapsed"
        except Exception:  # noqa: BLE001 - a view that cannot be read says nothing about this endpoint
            return None
        action = self._verdict(endpoint)
        if action in ("eject", "no_new_sessions"):
            return f"the regional agent's verdict: {action}"
        if self.outliers.ejected(endpoint.key):
            return "ejected locally after failures"
        return None

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
                      prefer: str | None = None, avoid: tuple[EndpointKey, ...] = (),
                      sampling: Sampling | None = None) -> Endpoint:
        """Take a slot on an endpoint, waiting in the bounded queue if all are busy.

        `sampling`: only endpoints that sample this way (a seeded continuation that must stay exact);
        `NoExactContinuation` when others are routable but none of these.
        `prefer`: an instance id to take if it is routable and has room (drills pin the first attempt).
        `avoid`: endpoint keys `(instance_id, generation)` to take only when no other is routable (those that
        failed the request, earliest first, the one that just failed it last): then the first of them.
        """
        deadline = self.clock.now() + queue_timeout
        if (leases := lease_view_of(self.view)) is not None:
            leases.check_admission()  # fail static only for a bounded window (LeaseView)
        while True:
            candidates = await self.endpoints(version)
            if sampling is not None and candidates:
                if not (candidates := [e for e in candidates if e.sampling == sampling.value]):
                    raise NoExactContinuation(f"no routable engine for {version!r} samples {sampling.value}: a "
                                              "sampled stream moved to another would continue differently")
            if avoid and candidates:
                candidates = _least_recently_failed(candidates, avoid)
            if prefer is not None:
                for endpoint in candidates:
                    if endpoint.instance_id == prefer and self.admission.has_room(prefer):
                        self.admission.take(prefer)
                        return endpoint
            if not candidates:
                raise await self._none_routable(version, avoid)
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

    async def _none_routable(self, version: str, failed_it: tuple[EndpointKey, ...]) -> NoHealthyEndpoint:
        """The error for a request that finds no candidate: which engines there are, and why none serves it."""
        retry_after = self.settings.admission.retry_after.total_seconds()
        routable = await self._routable(version)
        if routable and all(self.outliers.incompatible(e.key) for e in routable):
            names = ", ".join(sorted(e.instance_id for e in routable))
            return EngineIncompatible(f"no engine can serve {version!r}: " + missing_token_ids(names))
        ejected = sorted(f"{e.instance_id}@{e.generation}" for e in routable if e.key in failed_it)
        if ejected:
            return NoHealthyEndpoint(f"no live, ready engine serves {version!r} but those that failed this request "
                                     f"and are ejected ({', '.join(ejected)})", retry_after_s=retry_after)
        return NoHealthyEndpoint(f"no live, ready engine serves {version!r}", retry_after_s=retry_after)

    async def release(self, endpoint: Endpoint) -> None:
        await self.admission.give_back(endpoint.instance_id)

    def _pick(self, candidates: list[Endpoint], client_key: str | None) -> Endpoint | None:
        free = [e for e in candidates if self.admission.has_room(e.instance_id)]
        if not free:
            return None
        weight = {e.instance_id: self._weight(e) for e in candidates}
        if client_key is None:
            def load(e: Endpoint) -> float:
                return (self.admission.outstanding[e.instance_id] + 1) / weight[e.instance_id]
            least = min(load(e) for e in free)
            return random.choice([e for e in free if load(e) == least])
        by_id = {e.instance_id: e for e in candidates}
        total = sum(self.admission.outstanding[n] for n in by_id) + 1
        bound = math.ceil(self.settings.admission.hash_load_factor * total / len(by_id))
        walk = rendezvous_order(client_key, by_id)
        for name in walk:
            if self.admission.has_room(name) and self.admission.outstanding[name] + 1 <= bound * weight[name]:
                return by_id[name]
        for name in walk:  # every one is over its weighted bound: the unweighted bound, de-weighted ones included
            if self.admission.has_room(name) and self.admission.outstanding[name] < bound:
                return by_id[name]
        return None


def rendezvous_order(client_key: str, names: Iterable[str]) -> list[str]:
    """`names` by highest random weight for `client_key` (rendezvous hashing, Thaler and Ravishankar 1998).

    Every replica computes the same order with no shared state, and an
    endpoint that leaves moves only the keys it was first for. It replaced a
    ketama ring (uhashring), which cost 160 points per endpoint to build for
    every new endpoint set: 2.2 s and 26 MiB at 1,666 endpoints of a version
    on the event loop, each time one engine of the region came or went, and
    a walk of 17 ms a request; this costs 1.2 ms (bench/fleet.py, issue 29).
    """
    key = hashlib.blake2b(client_key.encode(), digest_size=16).digest()
    return sorted(names, key=lambda name: hashlib.blake2b(name.encode(), key=key, digest_size=8).digest(), reverse=True)
