"""Everything a gateway replica does with the control plane, built and stopped as one piece.

    snapshot poller  (routing.source=snapshot)  GET /api/v1/snapshot → SnapshotRouting
    reporter         (a controlplane_url set)   PUT /api/v1/gateways/{replica}
    L7 event shipper (a controlplane_url set)   POST /api/v1/events/dataplane

The lifespan plugs it in with a few lines (gateway/app.py):

    link = build_controlplane_link(settings, clock, metrics.registry)
    table = link.routing or build_routing_table(settings)
    view = link.wrap_view(LeaseView(...))
    router = Router(...); link.attach(router)
    await link.start(router, view)
    deps = Deps(..., served=link.served)  …  await link.stop()

None of it is on a request's path; with the control plane away the gateway
keeps routing on the snapshot it has (invariant 7).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from common.clock import Clock
from common.logs import get_logger
from contract.events import GatewayReport
from gateway.artifacts import ArtifactLoader
from gateway.l7_events import EventShipper
from gateway.report import GatewayReporter, ServedLedger, build_report
from gateway.settings import GatewaySettings
from gateway.snapshot_source import SnapshotSource
from gateway.snapshot_table import SnapshotLeaseView, SnapshotRouting, SnapshotTable

log = get_logger(__name__)


@dataclass
class ControlPlaneLink:
    settings: GatewaySettings
    clock: Clock
    events: EventShipper
    routing: SnapshotRouting | None = None
    source: SnapshotSource | None = None
    reporter: GatewayReporter | None = None
    served: ServedLedger = field(default_factory=ServedLedger)  # the stream sessions' (Deps.served): served_ok_at

    def wrap_view(self, view: Any) -> Any:
        """The lease view the router reads: with a snapshot, minus what it ejects or drains."""
        return SnapshotLeaseView(view, self.routing) if self.routing is not None else view

    def attach(self, router: Any) -> None:
        """Let the router report its own ejections as L7 events (`router.on_ejected`)."""
        router.on_ejected = lambda endpoint, reason: self.events.endpoint_ejected(
            endpoint.instance_id, endpoint.generation, reason, version=endpoint.version, zone=endpoint.zone)

    async def start(self, router: Any, view: Any) -> None:
        await self.events.start()
        if self.source is not None:
            await self.source.start()
        if self.reporter is not None:
            every = view.all_live if isinstance(view, SnapshotLeaseView) else view.current

            async def collect() -> GatewayReport:
                return await build_report(replica_id=self.settings.replica_id, region=self.settings.routing_region,
                                          zone=self.settings.zone, table=router.table, router=router,
                                          live=every, admitted=view.current, clock=self.clock, served=self.served)

            self.reporter.collect = collect
            await self.reporter.start()

    async def stop(self) -> None:
        if self.source is not None:
            await self.source.stop()
        if self.reporter is not None:
            await self.reporter.stop()
        await self.events.stop()


def build_controlplane_link(settings: GatewaySettings, clock: Clock,
                            metrics_registry: CollectorRegistry | None = None) -> ControlPlaneLink:
    cfg = settings.routing
    timeout = httpx.Timeout(connect=cfg.connect_timeout.total_seconds(), read=cfg.read_timeout.total_seconds(),
                            write=cfg.read_timeout.total_seconds(), pool=cfg.connect_timeout.total_seconds())
    events = EventShipper(replica_id=settings.replica_id, region=settings.routing_region, clock=clock,
                          buffer_size=cfg.event_buffer, flush_interval=cfg.event_flush_interval.total_seconds(),
                          controlplane_url=cfg.controlplane_url, token=cfg.token, metrics_registry=metrics_registry,
                          timeout=timeout)
    link = ControlPlaneLink(settings, clock, events)
    if cfg.controlplane_url is not None:
        link.reporter = GatewayReporter(replica_id=settings.replica_id, collect=_not_started,
                                        interval=cfg.report_interval.total_seconds(),
                                        controlplane_url=cfg.controlplane_url, token=cfg.token, timeout=timeout)
    if cfg.source == "snapshot":
        assert cfg.controlplane_url is not None and cfg.cache_path is not None  # validated in settings
        link.routing = SnapshotRouting(settings.routing_region)
        reporter = link.reporter

        def applied(_: SnapshotTable) -> None:
            if reporter is not None:
                reporter.nudge()

        link.source = SnapshotSource(
            routing=link.routing,
            loader=ArtifactLoader(download_dir=cfg.artifact_dir or cfg.cache_path.parent / "artifacts",
                                  s3_endpoint_url=cfg.s3_endpoint_url),
            events=events, make_event=events.event, clock=clock, controlplane_url=cfg.controlplane_url,
            cache_path=cfg.cache_path, token=cfg.token, poll_interval=cfg.poll_interval.total_seconds(),
            timeout=timeout, on_applied=applied, metrics_registry=metrics_registry)
    return link


async def _not_started() -> GatewayReport:  # replaced in ControlPlaneLink.start
    raise RuntimeError("the reporter runs only after ControlPlaneLink.start")
