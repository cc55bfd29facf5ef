"""A gateway moved from one control-plane database to another: applies the new one's lower versions, reports its epoch.

The snapshot source on an httpx.MockTransport that serves one database at a
time, honouring If-None-Match with the epoch-carrying ETag as the real
endpoint does; the report goes through `GatewayReporter` to a recorder.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from common.clock import ManualClock
from contract.events import GatewayReport
from contract.snapshot import RoutingSnapshot, if_none_match_hits
from gateway.artifacts import ArtifactLoader
from gateway.l7_events import EventShipper
from gateway.lease_registry import InMemoryLeaseRegistry
from gateway.report import GatewayReporter, build_report, report_body
from gateway.router import LeaseView
from gateway.snapshot_source import PollOutcome, SnapshotSource
from gateway.snapshot_table import SnapshotLeaseView, SnapshotRouting
from tests.support.snapshot_artifacts import snapshot_body, write_version

A, B = "aaaaaaaa-0000-4000-8000-000000000001", "bbbbbbbb-0000-4000-8000-000000000002"


class OneDatabaseAtATime:
    def __init__(self) -> None:
        self.body: dict | None = None

    def handler(self, request: httpx.Request) -> httpx.Response:
        assert self.body is not None
        etag = RoutingSnapshot.model_validate(self.body).etag
        if if_none_match_hits(request.headers.get("if-none-match"), etag):
            return httpx.Response(304, headers={"ETag": etag})
        return httpx.Response(200, json=self.body, headers={"ETag": etag})


@pytest.fixture
def gateway(tmp_path: Path):
    files = {v: write_version(tmp_path / "artifacts", v) for v in ("v1", "v2")}
    fake = OneDatabaseAtATime()
    clock = ManualClock()
    shipper = EventShipper(replica_id="gw-1", region="local", clock=clock, controlplane_url="http://cp")
    routing = SnapshotRouting("local")
    http = httpx.AsyncClient(base_url="http://cp", transport=httpx.MockTransport(fake.handler))
    source = SnapshotSource(routing=routing, loader=ArtifactLoader(download_dir=tmp_path / "dl"), events=shipper,
                            make_event=shipper.event, clock=clock, controlplane_url="http://cp",
                            cache_path=tmp_path / "state" / "snapshot.json", http=http)

    def serve(version: int, epoch: str | None, prod: str) -> None:
        fake.body = snapshot_body(version, tmp_path / "artifacts", files, aliases={"prod": prod},
                                  controlplane_epoch=epoch)

    return source, routing, shipper, serve, tmp_path


async def test_an_equal_version_from_another_database_is_applied_not_taken_for_unchanged(gateway):
    source, routing, shipper, serve, tmp_path = gateway
    serve(5, A, "v1")
    assert await source.poll_once() == PollOutcome.APPLIED
    serve(5, B, "v2")  # the same number, another database, other content
    assert await source.poll_once() == PollOutcome.APPLIED
    assert routing.resolve("tiny").version == "v2" and routing.table.epoch == B
    assert await source.poll_once() == PollOutcome.UNCHANGED


async def test_lower_versions_of_a_new_database_apply_and_older_ones_of_it_are_refused(gateway):
    source, routing, shipper, serve, tmp_path = gateway
    serve(40, A, "v1")
    await source.poll_once()
    serve(2, B, "v2")
    assert await source.poll_once() == PollOutcome.APPLIED
    assert (routing.table.version, routing.table.epoch) == (2, B)
    assert json.loads((tmp_path / "state" / "snapshot.json").read_text())["controlplane_epoch"] == B
    assert not [e for e in shipper.buffer if e.kind == "snapshot.refused"]
    serve(1, B, "v1")
    assert await source.poll_once() == PollOutcome.REFUSED
    assert routing.resolve("tiny").version == "v2"
    [refused] = [e for e in shipper.buffer if e.kind == "snapshot.refused"]
    assert "older" in refused.reason


async def test_the_report_names_the_epoch_of_the_applied_snapshot(gateway):
    source, routing, _, serve, tmp_path = gateway
    clock = ManualClock()
    registry = InMemoryLeaseRegistry(timedelta(seconds=2), clock, state_path=tmp_path / "gens.json")
    view = SnapshotLeaseView(LeaseView(registry, refresh_interval=1.0, cached=False), routing)

    class NoEndpoints:
        async def endpoints(self, version: str) -> list:
            return []

    async def collect() -> GatewayReport:
        return await build_report(replica_id="gw-1", region="local", zone="z", table=routing, router=NoEndpoints(),
                                  live=view.all_live, admitted=view.current, clock=clock)

    sent: list[dict] = []
    reporter = GatewayReporter(replica_id="gw-1", collect=collect, interval=5.0, controlplane_url="http://cp",
                               http=httpx.AsyncClient(base_url="http://cp", transport=httpx.MockTransport(
                                   lambda r: sent.append(json.loads(r.content)) or httpx.Response(200, json={}))))
    serve(7, B, "v1")
    await source.poll_once()
    assert await reporter.report_once()
    assert (sent[-1]["snapshot_version"], sent[-1]["snapshot_epoch"]) == (7, B)

    serve(8, None, "v1")  # a control plane from before epochs: it would refuse a field it does not know
    await source.poll_once()
    assert await reporter.report_once()
    assert sent[-1]["snapshot_version"] == 8 and "snapshot_epoch" not in sent[-1]
    assert GatewayReport.model_validate(sent[-1]).snapshot_epoch is None


def test_the_report_body_leaves_out_only_a_missing_epoch():
    report = GatewayReport(replica_id="gw", region="r", zone="z", routing_source="static",
                           reported_at=ManualClock().utcnow())
    body = report_body(report)
    assert "snapshot_epoch" not in body and body["snapshot_version"] is None  # None stays None elsewhere
    assert report_body(report.model_copy(update={"snapshot_epoch": A}))["snapshot_epoch"] == A
