"""The snapshot consumer on a fake control plane (httpx.MockTransport): apply, refuse, keep, restart from disk."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from common.clock import ManualClock
from contract.lease import Lease
from contract.snapshot import RoutingSnapshot, etag_for
from gateway.artifacts import ArtifactLoader
from gateway.errors import BadRequest, NoHealthyEndpoint
from gateway.l7_events import EventShipper
from gateway.snapshot_source import ControlPlaneUnreachable, PollOutcome, SnapshotSource
from gateway.snapshot_table import SnapshotRouting
from tests.support.snapshot_artifacts import snapshot_body, write_version


class FakeControlPlane:
    """Serves whatever body it is given, honouring If-None-Match like the real endpoint."""

    def __init__(self) -> None:
        self.body: bytes | None = None
        self.version: int | None = None
        self.down = False
        self.seen_if_none_match: list[str | None] = []
        self.seen_auth: list[str | None] = []

    def serve(self, body: dict | bytes, version: int | None = None) -> None:
        self.body = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.version = version if version is not None else (body["version"] if isinstance(body, dict) else None)

    def handler(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        self.seen_if_none_match.append(request.headers.get("if-none-match"))
        self.seen_auth.append(request.headers.get("authorization"))
        etag = etag_for(self.version or 0)
        if request.headers.get("if-none-match") == etag:
            return httpx.Response(304, headers={"ETag": etag})
        return httpx.Response(200, content=self.body, headers={"ETag": etag, "Content-Type": "application/json"})


@pytest.fixture
def world(tmp_path: Path):
    files = {v: write_version(tmp_path / "artifacts", v) for v in ("v1", "v2")}
    return tmp_path, files


def _source(tmp_path: Path, fake: FakeControlPlane, clock: ManualClock | None = None, **options):
    clock = clock or ManualClock()
    shipper = EventShipper(replica_id="gw-1", region="local", clock=clock, controlplane_url="http://cp")
    routing = SnapshotRouting("local")
    http = httpx.AsyncClient(base_url="http://cp", transport=httpx.MockTransport(fake.handler),
                             headers={"Authorization": "Bearer t0k"})
    source = SnapshotSource(routing=routing, loader=ArtifactLoader(download_dir=tmp_path / "dl"), events=shipper,
                            make_event=shipper.event, clock=clock, controlplane_url="http://cp",
                            cache_path=tmp_path / "state" / "snapshot.json", http=http, **options)
    return source, routing, shipper


async def test_a_good_snapshot_is_applied_cached_and_then_polled_with_its_etag(world):
    tmp_path, files = world
    fake = FakeControlPlane()
    fake.serve(snapshot_body(3, tmp_path / "artifacts", files, aliases={"prod": "v1", "canary": "v2"}))
    source, routing, _ = _source(tmp_path, fake)

    assert await source.poll_once() == PollOutcome.APPLIED
    assert routing.resolve("tiny").version == "v1"
    assert routing.resolve("tiny:canary").version == "v2"
    assert routing.resolve("v2").version == "v2"
    assert routing.resolve("tiny").tokenizer.encode("b a", add_special_tokens=False).ids == [2, 1]
    assert routing.resolve("tiny").chat_template is not None and routing.resolve("tiny").max_model_len == 256
    assert json.loads((tmp_path / "state" / "snapshot.json").read_text())["version"] == 3

    assert await source.poll_once() == PollOutcome.UNCHANGED
    assert fake.seen_if_none_match == [None, '"snapshot-3"']
    assert fake.seen_auth[-1] == "Bearer t0k"


async def test_an_invalid_snapshot_is_refused_evented_and_the_old_one_stays(world):
    tmp_path, files = world
    fake = FakeControlPlane()
    fake.serve(snapshot_body(3, tmp_path / "artifacts", files, aliases={"prod": "v1"}))
    source, routing, shipper = _source(tmp_path, fake)
    await source.poll_once()
    cached = (tmp_path / "state" / "snapshot.json").read_bytes()

    bad = snapshot_body(4, tmp_path / "artifacts", files, aliases={"prod": "v2"})
    bad["models"]["tiny"]["aliases"]["prod"]["version"] = "v9"  # an alias to a version the snapshot does not describe
    fake.serve(bad)
    assert await source.poll_once() == PollOutcome.REFUSED
    assert routing.resolve("tiny").version == "v1" and routing.table.version == 3
    assert (tmp_path / "state" / "snapshot.json").read_bytes() == cached
    refused = [e for e in shipper.buffer if e.kind == "snapshot.refused"]
    assert len(refused) == 1 and "validation" in refused[0].reason
    assert refused[0].routing_tier == "l7" and refused[0].actor == "gateway:gw-1"

    fake.serve(b"<html>proxy error</html>", version=5)
    assert await source.poll_once() == PollOutcome.REFUSED
    fake.serve(snapshot_body(2, tmp_path / "artifacts", files, aliases={"prod": "v2"}))  # older than applied
    assert await source.poll_once() == PollOutcome.REFUSED
    assert routing.resolve("tiny").version == "v1"
    assert len([e for e in shipper.buffer if e.kind == "snapshot.refused"]) == 3


async def test_restart_with_the_control_plane_down_serves_the_snapshot_on_disk(world):
    tmp_path, files = world
    fake = FakeControlPlane()
    fake.serve(snapshot_body(7, tmp_path / "artifacts", files, aliases={"prod": "v2"}))
    first, _, _ = _source(tmp_path, fake)
    await first.poll_once()

    fake.down = True
    restarted, routing, _ = _source(tmp_path, fake)
    with pytest.raises(NoHealthyEndpoint) as before:
        routing.resolve("tiny")
    assert before.value.error_type == "no_routing_snapshot"
    await restarted.start()  # loads the disk copy; its first poll fails and is only logged
    try:
        assert routing.resolve("tiny").version == "v2" and routing.table.version == 7
        with pytest.raises(ControlPlaneUnreachable):
            await restarted.poll_once()
        assert routing.table.version == 7

        fake.down = False  # the control plane returns with a newer snapshot: the next poll picks it up
        fake.serve(snapshot_body(8, tmp_path / "artifacts", files, aliases={"prod": "v1"}))
        assert await restarted.poll_once() == PollOutcome.APPLIED
        assert routing.resolve("tiny").version == "v1"
        assert fake.seen_if_none_match[-1] == '"snapshot-7"'
    finally:
        await restarted.stop()


async def test_a_corrupt_snapshot_on_disk_is_refused_evented_and_the_poll_replaces_it(world):
    tmp_path, files = world
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "snapshot.json").write_bytes(b'{"version": 7, "models": ')  # a torn write by hand
    fake = FakeControlPlane()
    fake.serve(snapshot_body(8, tmp_path / "artifacts", files, aliases={"prod": "v1"}))
    source, routing, shipper = _source(tmp_path, fake)

    assert await source.load_cached() is False
    [event] = [e for e in shipper.buffer if e.kind == "snapshot.refused"]
    assert event.detail["source"] == "disk" and "not usable" in event.reason
    assert await source.poll_once() == PollOutcome.APPLIED
    assert fake.seen_if_none_match == [None] and routing.table.version == 8
    assert json.loads((tmp_path / "state" / "snapshot.json").read_text())["version"] == 8


async def test_a_snapshot_that_failed_to_apply_is_applied_by_the_next_poll_even_a_304(world, monkeypatch):
    tmp_path, files = world
    fake = FakeControlPlane()
    fake.serve(snapshot_body(3, tmp_path / "artifacts", files, aliases={"prod": "v1"}))
    source, routing, _ = _source(tmp_path, fake)
    load = source.loader.load
    failures = iter([OSError("disk full while unpacking the tokenizer")])

    def load_failing_once(entry):
        for exc in failures:
            raise exc
        return load(entry)

    monkeypatch.setattr(source.loader, "load", load_failing_once)
    with pytest.raises(OSError, match="disk full"):
        await source.poll_once()
    assert routing.table.version is None  # the client holds version 3; the table does not yet

    assert await source.poll_once() == PollOutcome.APPLIED
    assert fake.seen_if_none_match[-1] == '"snapshot-3"'  # the control plane answered 304
    assert routing.table.version == 3 and routing.resolve("tiny").version == "v1"


async def test_a_snapshot_that_cannot_be_written_to_disk_is_still_applied(world):
    tmp_path, files = world
    fake = FakeControlPlane()
    fake.serve(snapshot_body(3, tmp_path / "artifacts", files, aliases={"prod": "v1"}))
    source, routing, _ = _source(tmp_path, fake)
    (tmp_path / "state").write_text("a file where the cache directory should be")

    assert await source.poll_once() == PollOutcome.APPLIED
    assert routing.table.version == 3 and routing.resolve("tiny").version == "v1"

async def test_a_version_whose_artifacts_fail_verification_is_not_routed_to(world):
    tmp_path, files = world
    (tmp_path / "artifacts" / "v2" / "tokenizer.json").write_text("{}")  # tampered after the catalog hashed it
    fake = FakeControlPlane()
    fake.serve(snapshot_body(3, tmp_path / "artifacts", files, aliases={"prod": "v1", "canary": "v2"}))
    source, routing, shipper = _source(tmp_path, fake)
    assert await source.poll_once() == PollOutcome.APPLIED
    assert routing.resolve("tiny").version == "v1"
    with pytest.raises(NoHealthyEndpoint) as refused:
        routing.resolve("tiny:canary")
    assert refused.value.error_type == "version_unverified" and "sha256" in refused.value.message
    assert [v.version for v in routing.versions()] == ["v1"]
    [event] = [e for e in shipper.buffer if e.kind == "snapshot.refused"]
    assert event.detail["weight_version"] == "v2"


async def test_a_version_without_listed_checksums_is_not_routed_to(world):
    tmp_path, files = world
    body = snapshot_body(3, tmp_path / "artifacts", files, aliases={"prod": "v1"})
    del body["models"]["tiny"]["versions"]["v1"]["files"]["tokenizer.json"]
    fake = FakeControlPlane()
    fake.serve(body)
    source, routing, _ = _source(tmp_path, fake)
    await source.poll_once()
    with pytest.raises(NoHealthyEndpoint, match="no sha256 for tokenizer.json"):
        routing.resolve("tiny")


async def test_a_reader_holding_a_table_sees_one_snapshot_across_a_swap(world):
    tmp_path, files = world
    fake = FakeControlPlane()
    fake.serve(snapshot_body(1, tmp_path / "artifacts", files, aliases={"prod": "v1"},
                             ejections=[{"region": "local", "instance_id": "e1", "generation": None, "reason": "x"}]))
    source, routing, _ = _source(tmp_path, fake)
    await source.poll_once()
    held = routing.table
    fake.serve(snapshot_body(2, tmp_path / "artifacts", files, aliases={"prod": "v2"}))
    await source.poll_once()
    lease = Lease("e1", 4, "http://e1", "v1")
    # The held table is whole: old alias and old ejections together; the new one likewise.
    assert source.loader.cached(RoutingSnapshot.model_validate(
        snapshot_body(1, tmp_path / "artifacts", files, aliases={"prod": "v1"})).models["tiny"].versions["v1"]) is None
    assert (held.resolve("tiny").version, held.admits(lease)) == ("v1", False)  # still whole: it holds its own
    assert (routing.table.resolve("tiny").version, routing.table.admits(lease)) == ("v2", True)
    with pytest.raises(BadRequest):
        routing.resolve("nope")


@pytest.mark.parametrize(
    ("routing", "message"),
    [
        ({"source": "snapshot", "cache_path": "/tmp/s.json"}, "routing.controlplane_url is required"),
        ({"source": "snapshot", "controlplane_url": "http://cp"}, "routing.cache_path is required"),
        ({"source": "snapshot", "controlplane_url": "http://cp", "cache_path": "/tmp/s.json", "poll_interval": 0},
         "routing.poll_interval must be positive"),
        ({"source": "static"}, "at least one model is required when routing.source is static"),
        ({"source": "snapshot", "controlplane_url": "http://cp", "cache_path": "/tmp/s.json", "pol_interval": 1},
         "pol_interval"),
    ],
)
def test_bad_routing_config_stops_start_up_naming_the_key(routing: dict, message: str):
    from pydantic import ValidationError

    from gateway.settings import GatewaySettings

    with pytest.raises(ValidationError, match=message):
        GatewaySettings(routing=routing)


def test_snapshot_routing_needs_no_static_models():
    from gateway.settings import GatewaySettings

    settings = GatewaySettings(region="eu", routing={"source": "snapshot", "controlplane_url": "http://cp",
                                                     "cache_path": "/tmp/s.json"})
    assert settings.models == [] and settings.routing_region == "eu"


def test_a_routing_region_that_disagrees_with_the_region_stops_start_up_naming_both(monkeypatch):
    """The trap: routing.region set, region left at its default; the gateway applied the snapshot and routed nothing."""
    from pydantic import ValidationError

    from gateway.settings import GatewaySettings

    snapshot = {"source": "snapshot", "controlplane_url": "http://cp", "cache_path": "/tmp/s.json"}
    with pytest.raises(ValidationError, match=r"routing\.region \('eu-west'\) and region \('local'\) disagree"):
        GatewaySettings(routing={**snapshot, "region": "eu-west"})
    monkeypatch.setenv("LIFELINE_GATEWAY_REGION", "us-east")  # the environment beats the file: still checked
    with pytest.raises(ValidationError, match="disagree"):
        GatewaySettings(routing={**snapshot, "region": "eu-west"})
    monkeypatch.delenv("LIFELINE_GATEWAY_REGION")
    agreed = GatewaySettings(region="eu-west", routing={**snapshot, "region": "eu-west"})
    assert agreed.routing_region == agreed.region == "eu-west"


async def test_metrics_say_which_snapshot_is_applied_and_when_the_control_plane_last_answered(world):
    """What the stale-snapshot and two-epochs alerts read: a 304 counts as an answer, unreachable does not."""
    from prometheus_client import CollectorRegistry

    tmp_path, files = world
    fake = FakeControlPlane()
    body = {**snapshot_body(3, tmp_path / "artifacts", files, aliases={"prod": "v1"}), "controlplane_epoch": "e-old"}
    fake.serve(body)
    clock = ManualClock()
    registry = CollectorRegistry()
    source, _, _ = _source(tmp_path, fake, clock, metrics_registry=registry)

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert sample("lifeline_gateway_snapshot_last_answer_timestamp_seconds") == 0  # never answered yet
    await source.poll_once()
    assert sample("lifeline_gateway_snapshot_applied_version") == 3
    assert sample("lifeline_gateway_snapshot_applied_epoch", epoch=body["controlplane_epoch"]) == 1
    assert sample("lifeline_gateway_snapshot_last_answer_timestamp_seconds") == clock.wall()
    clock.advance(30)
    assert await source.poll_once() == PollOutcome.UNCHANGED
    assert sample("lifeline_gateway_snapshot_last_answer_timestamp_seconds") == clock.wall()
    answered = clock.wall()
    clock.advance(30)
    fake.down = True
    with pytest.raises(ControlPlaneUnreachable):
        await source.poll_once()
    assert sample("lifeline_gateway_snapshot_last_answer_timestamp_seconds") == answered
    fake.down = False
    other = {**snapshot_body(1, tmp_path / "artifacts", files, aliases={"prod": "v2"}), "controlplane_epoch": "e-new"}
    fake.serve(other)  # another database: its lower version applies, and only the new epoch is shown
    assert await source.poll_once() == PollOutcome.APPLIED
    assert sample("lifeline_gateway_snapshot_applied_version") == 1
    assert sample("lifeline_gateway_snapshot_applied_epoch", epoch="e-new") == 1
    assert sample("lifeline_gateway_snapshot_applied_epoch", epoch=body["controlplane_epoch"]) is None
