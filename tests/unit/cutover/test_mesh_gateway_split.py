"""The mesh tier in the gateway: version splits, cohorts and zone shares from the snapshot's mesh routes."""

from __future__ import annotations

import random
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from common.clock import ManualClock
from contract.lease import Registration
from contract.mesh import MeshRoute
from contract.snapshot import RoutingSnapshot
from gateway import mesh
from gateway.admission import Admission
from gateway.artifacts import ArtifactLoader
from gateway.lease_registry import InMemoryLeaseRegistry
from gateway.router import LeaseView, Router
from gateway.routing_table import StaticRoutingTable, route_request
from gateway.settings import GatewaySettings
from gateway.snapshot_table import SnapshotLeaseView, SnapshotRouting, SnapshotTable
from tests.support.snapshot_artifacts import snapshot_body, write_version


def _route(cohort: str | None = None, region: str | None = None, **weights: int) -> dict[str, Any]:
    return {"model": "tiny", "region": region, "cohort": cohort,
            "destinations": [{"version": v, "weight": w} for v, w in weights.items()]}


def _table(tmp_path: Path, routes: list[dict[str, Any]], *, unverified: tuple[str, ...] = ()) -> SnapshotTable:
    versions = ("v1", "v2", "v3")
    files = {v: write_version(tmp_path, v) for v in versions}
    snapshot = RoutingSnapshot.model_validate(snapshot_body(
        7, tmp_path, files, aliases={"prod": "v1", "canary": "v2", "shadow": "v3"}, mesh_routes=routes))
    loader = ArtifactLoader(download_dir=tmp_path / "dl")
    artifacts = {v: loader.load(snapshot.models["tiny"].versions[v]) for v in versions if v not in unverified}
    return SnapshotTable.build(snapshot, region="eu", artifacts=artifacts,
                               unverified={v: "checksum mismatch" for v in unverified},
                               applied_at=ManualClock().utcnow())


def _routing(table: SnapshotTable) -> SnapshotRouting:
    routing = SnapshotRouting("eu")
    routing.apply(table)
    return routing


@pytest.mark.parametrize(("routes", "name", "cohort", "expected"), [
    pytest.param([], "tiny", None, {"v1"}, id="no-route-prod-alias"),
    pytest.param([_route(v1=0, v2=100)], "tiny", None, {"v2"}, id="all-weight-on-one-version"),
    pytest.param([_route(v1=100), _route("canary", v2=100)], "tiny", "canary", {"v2"}, id="cohort-route"),
    pytest.param([_route(v1=100), _route("canary", v2=100)], "tiny", "beta", {"v1"}, id="unknown-cohort-default"),
    pytest.param([_route("canary", v2=100)], "tiny", None, {"v1"}, id="no-default-route-prod-alias"),
    pytest.param([_route(v1=0, v2=0)], "tiny", None, {"v1"}, id="no-weight-left-prod-alias"),
    pytest.param([_route(v1=50, v2=50)], "tiny:shadow", None, {"v3"}, id="pinned-alias-not-split"),
    pytest.param([_route(v1=50, v2=50)], "v2", None, {"v2"}, id="pinned-version-not-split"),
    pytest.param([_route(v1=100), _route(region="eu", v3=100)], "tiny", None, {"v3"}, id="region-route-wins"),
    pytest.param([_route(v1=100), _route(region="us", v3=100)], "tiny", None, {"v1"}, id="other-region-ignored"),
])
def test_mesh_route_picks_the_version(tmp_path: Path, routes: list[dict[str, Any]], name: str,
                                      cohort: str | None, expected: set[str]) -> None:
    routing = _routing(_table(tmp_path, routes))
    picked = {routing.route(name, cohort=cohort, client_key=f"client-{i}").version for i in range(50)}
    assert picked == expected


def test_mesh_split_99_1_sends_about_one_percent_and_keeps_a_client_on_its_version(tmp_path: Path) -> None:
    table = _table(tmp_path, [_route(v1=99, v2=1)])
    rng = random.Random(7)
    shares = Counter(mesh.route(table, "tiny", cohort=None, client_key=None, rng=rng).version for _ in range(20000))
    assert 120 <= shares["v2"] <= 280 and shares["v1"] + shares["v2"] == 20000  # 1 % ± sampling noise (seeded)
    by_client = {k: mesh.route(table, "tiny", cohort=None, client_key=k).version for k in map(str, range(2000))}
    again = {k: mesh.route(table, "tiny", cohort=None, client_key=k).version for k in map(str, range(2000))}
    assert by_client == again and 0 < Counter(by_client.values())["v2"] < 100


def test_mesh_split_leaves_out_an_unverified_version(tmp_path: Path) -> None:
    routing = _routing(_table(tmp_path, [_route(v1=50, v2=50)], unverified=("v2",)))
    assert {routing.route("tiny", cohort=None, client_key=str(i)).version for i in range(100)} == {"v1"}


def test_route_request_falls_back_to_resolve_on_a_static_table() -> None:
    table = StaticRoutingTable(models=[])
    with pytest.raises(Exception, match="does not exist"):
        route_request(table, "tiny", cohort="canary", client_key=None)


def test_mesh_route_refuses_a_version_and_zone_named_twice() -> None:
    with pytest.raises(ValueError, match="twice"):
        MeshRoute.model_validate({"model": "tiny", "destinations": [{"version": "v1", "zone": "a", "weight": 1},
                                                                    {"version": "v1", "zone": "a", "weight": 2}]})


async def test_mesh_zone_weight_zero_takes_that_zones_instances_out(tmp_path: Path) -> None:
    zoned = {"model": "tiny", "destinations": [{"version": "v1", "zone": "eu-a", "weight": 0},
                                               {"version": "v1", "zone": "eu-b", "weight": 100}]}
    routing = _routing(_table(tmp_path, [zoned]))
    clock = ManualClock()
    registry = InMemoryLeaseRegistry(timedelta(seconds=2), clock, state_path=tmp_path / "generations.json")
    for instance_id, zone in (("a1", "eu-a"), ("b1", "eu-b"), ("c1", "eu-c")):
        await registry.register(Registration(instance_id, f"http://{instance_id}", "v1", zone=zone, region="eu"))
    settings = GatewaySettings(region="eu", routing={"source": "snapshot", "controlplane_url": "http://cp",
                                                     "cache_path": tmp_path / "s.json"})
    view = SnapshotLeaseView(LeaseView(registry, refresh_interval=1.0, cached=False), routing)
    router = Router(settings, routing, view, Admission(settings.admission), clock)
    assert sorted(e.instance_id for e in await router.endpoints("v1")) == ["b1", "c1"]  # eu-c is not named: in
