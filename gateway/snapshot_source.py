"""Poll the control plane's routing snapshot; apply good ones atomically; keep the last good one on disk.

    contract.snapshot_client.SnapshotClient          (shared with the regional agent)
      GET /api/v1/snapshot, If-None-Match: "snapshot-E-N" ──► 304: nothing to do
                                                         └► 200: validate, refuse if older (same epoch) → cache_path
    this module:  verify artifacts → SnapshotRouting.apply(new table)   (one swap)

Invariant 7 (data plane outlives control plane): on start the gateway loads
`cache_path` first and serves from it; the poll that follows replaces it if
the control plane is up. While the control plane is unreachable the poller
backs off (tenacity: exponential with jitter, capped at `_MAX_BACKOFF`)
and the table stays as it was; when the control plane returns, the next
poll carries the ETag of what is applied and gets a full snapshot if
anything changed (no deltas, so nothing to reconcile piecemeal).

A body that fails `RoutingSnapshot` validation, or whose version is below
the one applied within the same control-plane epoch, is refused (a
snapshot from another epoch — the gateway now polls another database —
applies whatever its version; `contract.snapshot_client.refusal`): logged, emitted as a `snapshot.refused` L7
event, and the old table stays. A version whose artifacts fail verification
is left out of the new table (its names answer 503 `version_unverified`),
also with a `snapshot.refused` event naming the version; the rest of the
snapshot applies. Versions that failed are tried again with the next
snapshot and on every start.

What it follows is on `/metrics`, for the alerts on a gateway that fell
behind (deploy/monitoring/lifeline-rules.yaml): the applied snapshot's version
and control-plane epoch, and when the control plane last gave a usable answer
(a 200, a 304 or a refused body: anything but unreachable).

Polling (not a long-poll/watch endpoint) because the control plane's
endpoint is a plain ETag GET and a 304 costs one small round trip; the
propagation this gives is measured in `bench/snapshot_propagation.py`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry, Gauge
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential_jitter

from common.clock import Clock
from common.logs import get_logger
from contract.snapshot import RoutingSnapshot
from contract.snapshot_client import PollOutcome, SnapshotClient
from gateway.artifacts import ArtifactLoader, ArtifactVerificationFailed, LoadedArtifacts
from gateway.l7_events import EventSink
from gateway.snapshot_table import SnapshotRouting, SnapshotTable

log = get_logger(__name__)

_MAX_BACKOFF = 2.0

__all__ = ["ControlPlaneUnreachable", "PollOutcome", "SnapshotSource"]


class ControlPlaneUnreachable(Exception):
    """No usable answer this time (transport error, 5xx, 401…): keep the table, try again later."""


@dataclass(frozen=True)
class _Verified:
    artifacts: dict[str, LoadedArtifacts]
    unverified: dict[str, str]


class SnapshotSource:
    def __init__(self, *, routing: SnapshotRouting, loader: ArtifactLoader, events: EventSink,
                 make_event: Callable[..., object], clock: Clock, controlplane_url: str, cache_path: Path,
                 token: str | None = None, poll_interval: float = 0.25,
                 timeout: httpx.Timeout | None = None, http: httpx.AsyncClient | None = None,
                 on_applied: Callable[[SnapshotTable], None] | None = None,
                 metrics_registry: CollectorRegistry | None = None) -> None:
        self.routing = routing
        self.loader = loader
        self.events = events
        self.make_event = make_event
        self.clock = clock
        self.cache_path = cache_path
        self.poll_interval = poll_interval
        self.on_applied = on_applied
        self.http = http or httpx.AsyncClient(
            timeout=timeout or httpx.Timeout(connect=1.0, read=5.0, write=5.0, pool=1.0))
        self._owns_http = http is None
        self.client = SnapshotClient(self.http, controlplane_url, token=token, cache_path=cache_path)
        self._task: asyncio.Task | None = None
        self.polls = 0
        self.failures = 0
        registry = metrics_registry or CollectorRegistry()
        self.m_version = Gauge("lifeline_gateway_snapshot_applied_version", "Version of the routing snapshot "
                               "this gateway applied", registry=registry)
        self.m_epoch = Gauge("lifeline_gateway_snapshot_applied_epoch", "1 for the control-plane epoch (database) "
                             "of the applied snapshot", ["epoch"], registry=registry)
        self.m_answered = Gauge("lifeline_gateway_snapshot_last_answer_timestamp_seconds", "When the control "
                                "plane last answered a snapshot poll usably (Unix time)", registry=registry)

    @property
    def applied(self) -> SnapshotTable:
        return self.routing.table

    # -- start-up: the disk copy, then one poll ----------------------------------------------
    async def load_cached(self) -> bool:
        """Apply the snapshot at `cache_path` if there is a valid one; True if applied."""
        snapshot = await asyncio.to_thread(self.client.load_cache)
        if snapshot is None:
            if self.cache_path.exists():  # the client logged why
                self._refuse(f"the snapshot on disk {self.cache_path} is not usable", source="disk")
            else:
                log.info("no snapshot on disk yet", path=str(self.cache_path))
            return False
        await self._apply(snapshot)
        log.info("serving the snapshot on disk", version=snapshot.version, path=str(self.cache_path))
        return True

    async def start(self) -> None:
        await self.load_cached()
        try:
            await self.poll_once()
        except ControlPlaneUnreachable as exc:
            log.warning("control plane unreachable at start; serving the last good snapshot",
                        error=str(exc), version=self.applied.version)
        self._task = asyncio.create_task(self._run(), name="snapshot-poller")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._owns_http:
            await self.http.aclose()

    # -- polling ---------------------------------------------------------------------------------
    async def poll_once(self) -> PollOutcome:
        """One conditional GET; raises ControlPlaneUnreachable when there is no usable answer.

        The table follows the client's snapshot, not the poll's outcome: a snapshot
        the client took but the gateway failed to apply (its artifacts' download
        raised) is applied on the next poll, even if that one answers 304.
        """
        self.polls += 1
        try:
            outcome = await self.client.poll()
        except httpx.HTTPError as exc:  # what the client does not count as a transport failure (decoding…)
            raise ControlPlaneUnreachable(repr(exc)[:200]) from None
        if outcome is PollOutcome.UNREACHABLE:
            raise ControlPlaneUnreachable(f"no usable answer from {self.client.url}")
        self.m_answered.set(self.clock.wall())
        if outcome is PollOutcome.REFUSED:
            self._refuse(self.client.last_refusal or "snapshot refused")
            return outcome
        snapshot = self.client.current
        same = (snapshot is not None and snapshot.version == self.applied.version
                and snapshot.controlplane_epoch == self.applied.epoch)  # another database's equal version is new
        if snapshot is None or (same and (outcome is PollOutcome.UNCHANGED or not self.applied.unverified)):
            return PollOutcome.UNCHANGED
        await self._apply(snapshot)
        return PollOutcome.APPLIED

    async def _run(self) -> None:
        retrying = AsyncRetrying(
            wait=wait_exponential_jitter(initial=self.poll_interval, max=_MAX_BACKOFF),
            retry=retry_if_exception_type(ControlPlaneUnreachable),
            before_sleep=self._log_unreachable,
        )
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                async for attempt in retrying:
                    with attempt:
                        await self.poll_once()
            except Exception as exc:  # never let the poller die: the table stays, the next tick tries again
                log.error("snapshot poll failed", error=repr(exc)[:300])

    def _log_unreachable(self, state) -> None:  # tenacity's RetryCallState
        self.failures += 1
        if state.attempt_number in (1, 10) or state.attempt_number % 100 == 0:
            exc = state.outcome.exception() if state.outcome else None
            log.warning("control plane unreachable; serving the last good snapshot", attempts=state.attempt_number,
                        error=str(exc)[:200], version=self.applied.version)

    # -- applying ----------------------------------------------------------------------------------
    async def _verify(self, snapshot: RoutingSnapshot) -> _Verified:
        artifacts: dict[str, LoadedArtifacts] = {}
        unverified: dict[str, str] = {}
        for model in snapshot.models.values():
            for name, entry in model.versions.items():
                loaded = self.loader.cached(entry)
                if loaded is None:
                    try:
                        loaded = await asyncio.to_thread(self.loader.load, entry)
                    except ArtifactVerificationFailed as exc:
                        unverified[name] = exc.message
                        continue
                artifacts[name] = loaded
        return _Verified(artifacts, unverified)

    async def _apply(self, snapshot: RoutingSnapshot) -> None:
        verified = await self._verify(snapshot)
        previous = self.applied
        for version, why in verified.unverified.items():
            if (previous.unverified.get(version) != why or previous.version != snapshot.version
                    or previous.epoch != snapshot.controlplane_epoch):
                self._refuse(f"version {version!r} is not routed to: {why}", version=snapshot.version,
                             weight_version=version, scope="version")
        table = SnapshotTable.build(snapshot, region=self.routing.table.region, artifacts=verified.artifacts,
                                    unverified=verified.unverified, applied_at=self.clock.utcnow())
        self.routing.apply(table)
        self.m_version.set(table.version)
        self.m_epoch.clear()
        self.m_epoch.labels(epoch=table.epoch or "").set(1)
        self.loader.retain({v for model in snapshot.models.values() for v in model.versions})
        log.info("snapshot applied", version=snapshot.version, previous=previous.version,
                 names=sorted(table.by_name), unverified=sorted(verified.unverified))
        if self.on_applied is not None:
            self.on_applied(table)

    def _refuse(self, reason: str, **detail: str | int | None) -> None:
        log.error("snapshot refused", reason=reason, applied=self.applied.version, **detail)
        self.events.emit(self.make_event("snapshot.refused", reason, applied_version=self.applied.version, **detail))

