"""What a snapshot removes from one region's routing: ejections, drained and ejected zones."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from common.clock import ManualClock
from contract.lease import Registration
from contract.snapshot import RoutingSnapshot
from gateway.admission import Admission
from gateway.artifacts import ArtifactLoader
from gateway.lease_registry import InMemoryLeaseRegistry
from gateway.router import LeaseView, Router
from gateway.settings import GatewaySettings
from gateway.snapshot_table import SnapshotLeaseView, SnapshotRouting, SnapshotTable
from tests.support.snapshot_artifacts import snapshot_body, write_version


def _cluster(name: str, zone: str | None, state: str, weight: int = 10, region: str = "eu") -> dict:
    return {"name": name, "region": region, "zone": zone, "model": "tiny", "endpoint": f"http://{name}",
            "weight": weight, "state": state}


def _table(tmp_path: Path, **extra) -> SnapshotTable:
    files = {"v1": write_version(tmp_path, "v1")}
    snapshot = RoutingSnapshot.model_validate(snapshot_body(5, tmp_path, files, aliases={"prod": "v1"}, **extra))
    loader = ArtifactLoader(download_dir=tmp_path / "dl")
    artifacts = {"v1": loader.load(snapshot.models["tiny"].versions["v1"])}
    return SnapshotTable.build(snapshot, region="eu", artifacts=artifacts, unverified={}, applied_at=ManualClock().utcnow())


async def _routed(tmp_path: Path, table: SnapshotTable) -> list[str]:
    clock = ManualClock()
    registry = InMemoryLeaseRegistry(timedelta(seconds=2), clock, state_path=tmp_path / "generations.json")
    for instance_id, zone in (("a1", "eu-a"), ("a2", "eu-a"), ("b1", "eu-b"), ("c1", "eu-c")):
        await registry.register(Registration(instance_id, f"http://{instance_id}", "v1", zone=zone, region="eu"))
    await registry.register(Registration("a2", "http://a2", "v1", zone="eu-a", region="eu"))  # a2 restarted: gen +1
    routing = SnapshotRouting("eu")
    routing.apply(table)
    settings = GatewaySettings(region="eu", routing={"source": "snapshot", "controlplane_url": "http://cp",
                                                     "cache_path": tmp_path / "s.json"})
    view = SnapshotLeaseView(LeaseView(registry, refresh_interval=1.0, cached=False), routing)
    router = Router(settings, routing, view, Admission(settings.admission), clock)
    version = routing.resolve("tiny").version
    return sorted(e.instance_id for e in await router.endpoints(version))


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        pytest.param({}, ["a1", "a2", "b1", "c1"], id="nothing-removed"),
        pytest.param({"ejections": [{"region": "eu", "instance_id": "b1", "generation": None, "reason": "operator"}]},
                     ["a1", "a2", "c1"], id="ejection-of-every-generation"),
        pytest.param({"ejections": [{"region": "eu", "instance_id": "a2", "generation": 1, "reason": "old gen"}]},
                     ["a1", "a2", "b1", "c1"], id="ejection-of-an-older-generation-spares-the-new-one"),
        pytest.param({"ejections": [{"region": "eu", "instance_id": "a2", "generation": 2, "reason": "bad gen"}]},
                     ["a1", "b1", "c1"], id="ejection-of-the-current-generation"),
        pytest.param({"ejections": [{"region": "us", "instance_id": "b1", "generation": None, "reason": "elsewhere"}]},
                     ["a1", "a2", "b1", "c1"], id="ejection-in-another-region"),
        pytest.param({"tier_weights": {"tiny": {"eu": {"eu-a": 0, "eu-b": 10}}}}, ["b1", "c1"],
                     id="drained-zone-out-undeclared-zone-in"),
        pytest.param({"tier_weights": {"tiny": {"eu": {"*": 0}}}}, [], id="region-wide-cluster-drained"),
        pytest.param({"tier_weights": {"tiny": {"eu": {"*": 0, "eu-b": 5}}}}, ["b1"], id="zone-cluster-beside-drained-region-wide"),
        pytest.param({"tier_weights": {"tiny": {"us": {"*": 0}}}}, ["a1", "a2", "b1", "c1"], id="other-region-drained"),
    ],
)
async def test_snapshot_removes_ejected_and_drained_instances(tmp_path: Path, extra: dict, expected: list[str]):
    routed = await _routed(tmp_path, _table(tmp_path, **extra))
    assert routed == expected


def test_weights_come_from_active_clusters_only(tmp_path: Path):
    # The producer sums only active clusters; a zone whose only cluster drains has weight 0.
    table = _table(tmp_path, clusters=[_cluster("c-a", "eu-a", "draining"), _cluster("c-b", "eu-b", "active")],
                   tier_weights={"tiny": {"eu": {"eu-a": 0, "eu-b": 10}}}, drains=["c-a"])
    assert [v.alias for v in table.versions()] == ["tiny"]
    assert table.declared_engines("v1") == []
