"""Tell the control plane what this gateway replica applied and routes to: `PUT /api/v1/gateways/{replica}`.

The report (`contract.events.GatewayReport`) says which snapshot version is
applied and since when, the live endpoints this replica would route to now,
and how many live instances it leaves out: `ejected` by the snapshot
(ejections, drained or ejected zones) and `suppressed` locally after a
failure. A cutover step verifies an L7 change by reading back that every
gateway of the region reports `snapshot_version >= N`, so a report goes out
at once after each apply (`nudge`) as well as every `routing.report_interval`.
It names the snapshot's control-plane epoch beside its version
(`snapshot_epoch`): versions of two databases are not comparable, and the
control plane does not count a version from another epoch as applied.
Reports are state, not a log: a lost one is replaced by the next, so a
failure is logged and nothing is queued.

Each live endpoint carries `served_ok_at`: when a stream last finished on it
(its final token committed, `gateway/recovery.py` notes it in the
`ServedLedger`). The regional agent counts that as a canary passed
(`warm_pool/served.py`), so busy instances are not probed on top of their
traffic. Finished, not merely started: a first token says the engine is up,
a finished stream says it generated to the end, which is what a canary checks.
Keyed by (instance, generation): a restarted engine has served nothing yet.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import Protocol

import httpx

from common.clock import Clock
from common.logs import get_logger
from contract.events import GatewayReport, LiveEndpoint
from contract.lease import Lease
from gateway.routing_table import RoutingTable
from gateway.snapshot_table import SnapshotRouting

log = get_logger(__name__)


EndpointKey = tuple[str, int | None]  # (instance_id, generation), as gateway.router.Endpoint.key


class _Endpoints(Protocol):
    async def endpoints(self, version: str) -> list: ...  # gateway.router.Router


class ServedLedger:
    """When a stream last finished OK on each endpoint; one per replica, written by its stream sessions."""

    def __init__(self) -> None:
        self._finished_at: dict[EndpointKey, datetime] = {}

    def note(self, key: EndpointKey, at: datetime) -> None:
        if key not in self._finished_at or at > self._finished_at[key]:
            self._finished_at[key] = at

    def served_ok_at(self, key: EndpointKey) -> datetime | None:
        return self._finished_at.get(key)

    def retain(self, keys: Iterable[EndpointKey]) -> None:
        """Forget endpoints no longer live (a generation an engine left behind), so the ledger stays small."""
        keep = set(keys)
        self._finished_at = {key: at for key, at in self._finished_at.items() if key in keep}


async def build_report(*, replica_id: str, region: str, zone: str, table: RoutingTable, router: _Endpoints,
                       live: Callable[[], Awaitable[list[Lease]]],
                       admitted: Callable[[], Awaitable[list[Lease]]], clock: Clock,
                       served: ServedLedger | None = None) -> GatewayReport:
    """`live`: every live lease of the region; `admitted`: those the snapshot lets through (same for static)."""
    snapshot = table.table if isinstance(table, SnapshotRouting) else None
    versions = sorted({v.version for v in table.versions()})
    endpoints: list[LiveEndpoint] = []
    for version in versions:
        for e in await router.endpoints(version):
            endpoints.append(LiveEndpoint(instance_id=e.instance_id, generation=e.generation, version=version, zone=e.zone,
                                          served_ok_at=served.served_ok_at(e.key) if served is not None else None))
    every, through = await live(), await admitted()
    if served is not None:
        served.retain((lease.instance_id, lease.generation) for lease in every)
    through_for_versions = [lease for lease in through if lease.version in versions]
    return GatewayReport(
        replica_id=replica_id, region=region, zone=zone,
        snapshot_version=snapshot.version if snapshot else None,
        snapshot_epoch=snapshot.epoch if snapshot else None,
        snapshot_applied_at=snapshot.applied_at if snapshot else None,
        routing_source="snapshot" if snapshot is not None else "static",
        live_endpoints=endpoints,
        suppressed=max(0, len(through_for_versions) - len(endpoints)),
        ejected=max(0, len(every) - len(through)),
        reported_at=clock.utcnow(),
    )


def report_body(report: GatewayReport) -> dict:
    """The PUT body; `snapshot_epoch` left out when there is none.

    A control plane from before epochs serves snapshots without one and
    refuses fields it does not know (the contract forbids extras), so a
    gateway routing by its snapshot must not send the field to it.
    """
    body = report.model_dump(mode="json")
    if body.get("snapshot_epoch") is None:
        body.pop("snapshot_epoch", None)
    return body


class GatewayReporter:
    def __init__(self, *, replica_id: str, collect: Callable[[], Awaitable[GatewayReport]], interval: float,
                 controlplane_url: str, token: str | None = None, http: httpx.AsyncClient | None = None,
                 timeout: httpx.Timeout | None = None) -> None:
        self.replica_id = replica_id
        self.collect = collect
        self.interval = interval
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = http or httpx.AsyncClient(base_url=controlplane_url, headers=headers,
                                              timeout=timeout or httpx.Timeout(connect=1.0, read=5.0, write=5.0, pool=1.0))
        self._owns_http = http is None
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.sent = 0
        self.last_report: GatewayReport | None = None

    def nudge(self) -> None:
        """Report now (after a snapshot apply), not at the next interval."""
        self._wake.set()

    async def report_once(self) -> bool:
        report = await self.collect()
        try:
            response = await self.http.put(f"/api/v1/gateways/{self.replica_id}", json=report_body(report))
        except httpx.HTTPError as exc:
            log.warning("gateway report not sent", error=repr(exc)[:200])
            return False
        if not response.is_success:
            log.warning("gateway report refused", status=response.status_code, body=response.text[:300])
            return False
        self.sent += 1
        self.last_report = report
        return True

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.interval)
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.report_once()
            except Exception as exc:  # never let the reporter die
                log.error("gateway report failed", error=repr(exc)[:300])

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="gateway-reporter")
            self.nudge()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._owns_http:
            await self.http.aclose()
