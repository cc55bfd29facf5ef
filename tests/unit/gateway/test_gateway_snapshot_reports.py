"""L7 events leave the gateway in bounded batches; reports say what a replica applied and routes to."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry

from common.clock import ManualClock
from contract.events import MAX_BATCH, EventBatch, GatewayReport
from contract.lease import Registration
from contract.snapshot import RoutingSnapshot
from gateway.artifacts import ArtifactLoader
from gateway.l7_events import EventShipper
from gateway.lease_registry import InMemoryLeaseRegistry
from gateway.report import GatewayReporter, build_report
from gateway.router import Endpoint, LeaseView
from gateway.snapshot_table import SnapshotLeaseView, SnapshotRouting, SnapshotTable
from tests.support.snapshot_artifacts import snapshot_body, write_version


class Recorder:
    def __init__(self, *statuses: int | Exception) -> None:
        self.statuses = list(statuses)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        status = self.statuses.pop(0) if self.statuses else 202
        if isinstance(status, Exception):
            raise status
        return httpx.Response(status, json={})

    def batches(self) -> list[EventBatch]:
        return [EventBatch.model_validate_json(r.content) for r in self.requests]


def _shipper(recorder: Recorder, *, buffer_size: int = 1000) -> tuple[EventShipper, CollectorRegistry]:
    registry = CollectorRegistry()
    http = httpx.AsyncClient(base_url="http://cp", transport=httpx.MockTransport(recorder))
    shipper = EventShipper(replica_id="gw-1", region="eu", clock=ManualClock(), buffer_size=buffer_size,
                           controlplane_url="http://cp", http=http, metrics_registry=registry)
    return shipper, registry


def _dropped(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("lifeline_gateway_l7_events_dropped_total") or 0.0


async def test_a_full_buffer_drops_and_counts_and_the_next_batch_says_so():
    recorder = Recorder()
    shipper, registry = _shipper(recorder, buffer_size=3)
    for i in range(5):
        shipper.endpoint_ejected(f"e{i}", i + 1, "connect", version="v1")
    assert len(shipper.buffer) == 3 and _dropped(registry) == 2

    assert await shipper.flush_once() == 3
    [batch] = recorder.batches()
    assert [e.instance_id for e in batch.events] == ["e0", "e1", "e2"] and batch.dropped == 2
    first = batch.events[0]
    assert (first.kind, first.routing_tier, first.actor, first.region, first.reason, first.generation) == (
        "instance.suppressed", "l7", "gateway:gw-1", "eu", "connect", 1)
    assert recorder.requests[0].url.path == "/api/v1/events/dataplane"
    assert await shipper.flush_once() == 0 and len(recorder.requests) == 1  # nothing new: no request


async def test_an_unreachable_control_plane_keeps_events_in_order_until_it_returns():
    recorder = Recorder(httpx.ConnectError("refused"), 503)
    shipper, registry = _shipper(recorder)
    shipper.endpoint_ejected("e1", 3, "stale_generation")
    shipper.endpoint_ejected("e2", 4, "stall")
    assert await shipper.flush_once() == 0
    assert await shipper.flush_once() == 0
    assert await shipper.flush_once() == 2
    events = recorder.batches()[-1].events
    assert [(e.kind, e.instance_id) for e in events] == [("generation.fenced", "e1"), ("instance.suppressed", "e2")]
    assert _dropped(registry) == 0


async def test_a_batch_the_control_plane_refuses_as_malformed_is_dropped_and_counted():
    recorder = Recorder(422)
    shipper, registry = _shipper(recorder)
    shipper.endpoint_ejected("e1", 3, "connect")
    assert await shipper.flush_once() == 0
    assert not shipper.buffer and _dropped(registry) == 1
    await shipper.flush_once()  # no events left, but the hole is reported
    assert len(recorder.requests) == 2 and recorder.batches()[-1] == EventBatch(events=[], dropped=1)
    await shipper.flush_once()
    assert len(recorder.requests) == 2  # reported once


async def test_batches_are_capped_at_the_contract_limit():
    recorder = Recorder()
    shipper, _ = _shipper(recorder, buffer_size=MAX_BATCH + 100)
    for i in range(MAX_BATCH + 100):
        shipper.endpoint_ejected(f"e{i}", 1, "connect")
    assert await shipper.flush_once() == MAX_BATCH
    assert await shipper.flush_once() == 100


async def test_without_a_control_plane_events_are_only_logged():
    shipper = EventShipper(replica_id="gw-1", region="eu", clock=ManualClock())
    shipper.endpoint_ejected("e1", 1, "connect")
    assert not shipper.buffer and await shipper.flush_once() == 0
    await shipper.stop()


class FakeRouter:
    """Stands for gateway.router.Router: routes to the admitted leases minus the ones it ejected itself."""

    def __init__(self, view: SnapshotLeaseView, ejected: set[str]) -> None:
        self.view = view
        self.ejected = ejected

    async def endpoints(self, version: str) -> list[Endpoint]:
        return [Endpoint(l.instance_id, l.generation, l.url, l.version, l.zone) for l in await self.view.current()
                if l.version == version and l.instance_id not in self.ejected]


async def test_the_report_names_the_applied_snapshot_live_endpoints_and_removals(tmp_path: Path):
    clock = ManualClock()
    files = {"v1": write_version(tmp_path, "v1")}
    body = snapshot_body(9, tmp_path, files, aliases={"prod": "v1"},
                         ejections=[{"region": "eu", "instance_id": "b1", "generation": None, "reason": "operator"}])
    snapshot = RoutingSnapshot.model_validate(body)
    loaded = ArtifactLoader(download_dir=tmp_path / "dl").load(snapshot.models["tiny"].versions["v1"])
    routing = SnapshotRouting("eu")
    routing.apply(SnapshotTable.build(snapshot, region="eu", artifacts={"v1": loaded}, unverified={},
                                      applied_at=clock.utcnow()))
    registry = InMemoryLeaseRegistry(timedelta(seconds=2), clock, state_path=tmp_path / "gens.json")
    for instance_id in ("a1", "a2", "b1"):
        await registry.register(Registration(instance_id, f"http://{instance_id}", "v1", zone="eu-a", region="eu"))
    view = SnapshotLeaseView(LeaseView(registry, refresh_interval=1.0, cached=False), routing)
    router = FakeRouter(view, ejected={"a2"})

    async def collect() -> GatewayReport:
        return await build_report(replica_id="gw-1", region="eu", zone="eu-a", table=routing, router=router,
                                  live=view.all_live, admitted=view.current, clock=clock)

    recorder = Recorder()
    reporter = GatewayReporter(replica_id="gw-1", collect=collect, interval=5.0, controlplane_url="http://cp",
                               http=httpx.AsyncClient(base_url="http://cp", transport=httpx.MockTransport(recorder)))
    assert await reporter.report_once()
    request = recorder.requests[0]
    assert (request.method, request.url.path) == ("PUT", "/api/v1/gateways/gw-1")
    report = GatewayReport.model_validate(json.loads(request.content))
    assert (report.snapshot_version, report.routing_source, report.snapshot_applied_at) == (9, "snapshot", clock.utcnow())
    assert [(e.instance_id, e.generation, e.version) for e in report.live_endpoints] == [("a1", 1, "v1")]
    assert (report.ejected, report.suppressed) == (1, 1)
    assert (report.region, report.zone) == ("eu", "eu-a")


async def test_a_failed_report_is_not_queued():
    async def collect() -> GatewayReport:
        return GatewayReport(replica_id="gw-1", region="eu", zone="eu-a", routing_source="static",
                             reported_at=ManualClock().utcnow())

    recorder = Recorder(httpx.ConnectError("refused"), 500)
    reporter = GatewayReporter(replica_id="gw-1", collect=collect, interval=5.0, controlplane_url="http://cp",
                               http=httpx.AsyncClient(base_url="http://cp", transport=httpx.MockTransport(recorder)))
    assert not await reporter.report_once()
    assert not await reporter.report_once()
    assert await reporter.report_once() and reporter.sent == 1
