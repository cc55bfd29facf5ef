"""The mesh tier in Lifeline's gateways: mesh routes through the API and the snapshot, and a zone cut over.

The served control plane's built-in mesh driver (cutover/drivers/snapshot_mesh.py), on
SQLite and PostgreSQL; the snapshot each change produces is read back as
the contract record gateways apply and checked with the gateway's own
mesh functions (gateway/mesh.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from contract.snapshot import RoutingSnapshot
from gateway import mesh as gateway_mesh
from tests.integration.cutover.test_cutover_support import topology_two_regions  # noqa: F401 - fixture
from tests.support.controlplane_testing import write_artifact

pytestmark = pytest.mark.usefixtures("topology_two_regions")

CATALOG = "/api/v1/catalog/models/m"
SPLIT = {"model": "m", "reason": "1% canary in eu-a",
         "destinations": [{"version": "v1", "zone": "eu-a", "weight": 50},
                          {"version": "v1", "zone": "eu-b", "weight": 49},
                          {"version": "v2", "zone": "eu-a", "weight": 1}]}


@pytest.fixture
def catalog(client: TestClient, as_role: Any, tmp_path: Path) -> None:
    op = as_role("operator")
    for name in ("v1", "v2"):
        root = write_artifact(tmp_path / name, seed=int(name[1]))
        assert client.post(f"{CATALOG}/versions", json={"version": name, "location": str(root)},
                           headers=op).status_code == 201
    for alias, version in (("prod", "v1"), ("canary", "v2")):
        assert client.post(f"{CATALOG}/aliases/{alias}/promote", json={"version": version},
                           headers=op).status_code == 200


def _snapshot(client: TestClient, as_role: Any) -> RoutingSnapshot:
    return RoutingSnapshot.model_validate(client.get("/api/v1/snapshot", headers=as_role("viewer")).json())


def _weights(snapshot: RoutingSnapshot) -> dict[str, int]:
    (route,) = snapshot.mesh_routes
    return {f"{d.version}@{d.zone}": d.weight for d in route.destinations}


@pytest.mark.usefixtures("catalog")
def test_mesh_route_reaches_the_snapshot_with_one_version_bump_and_an_event(client: TestClient, as_role: Any) -> None:
    before = _snapshot(client, as_role).version
    answer = client.put("/api/v1/mesh-routes", json=SPLIT, headers=as_role("operator"))
    assert answer.status_code == 200, answer.text
    assert answer.json()["revision"] == 1
    snapshot = _snapshot(client, as_role)
    assert snapshot.version == before + 1
    assert _weights(snapshot) == {"v1@eu-a": 50, "v1@eu-b": 49, "v2@eu-a": 1}
    assert snapshot.mesh_routes[0].version_weights() == {"v1": 99, "v2": 1}
    events = client.get("/api/v1/events", params={"routing_tier": "mesh", "kind": "mesh.route"},
                        headers=as_role("viewer")).json()
    assert [e["after"]["revision"] for e in events] == [1]
    assert client.get("/api/v1/mesh-routes", headers=as_role("viewer")).json()[0]["destinations"][2] == {
        "version": "v2", "zone": "eu-a", "weight": 1}


@pytest.mark.usefixtures("catalog")
@pytest.mark.parametrize(("change", "status", "error"), [
    ({"destinations": [{"version": "v9", "weight": 1}]}, 422, "mesh_unknown_version"),
    ({"destinations": [{"version": "v1", "weight": 0}]}, 422, "invalid_request"),
    ({"destinations": [{"version": "v1", "weight": -1}]}, 422, "invalid_request"),
    ({"cohort": "has space"}, 422, "invalid_request"),
    ({"expected_revision": 3}, 409, "mesh_route_conflict"),
    ({"extra": 1}, 422, "invalid_request"),
])
def test_bad_mesh_route_is_refused_and_changes_nothing(client: TestClient, as_role: Any, change: dict[str, Any],
                                                       status: int, error: str) -> None:
    before = _snapshot(client, as_role)
    answer = client.put("/api/v1/mesh-routes", json={**SPLIT, **change}, headers=as_role("operator"))
    assert (answer.status_code, answer.json()["error"]["type"]) == (status, error)
    after = _snapshot(client, as_role)
    assert (after.version, after.mesh_routes) == (before.version, [])
    assert client.put("/api/v1/mesh-routes", json=SPLIT, headers=as_role("viewer")).status_code == 403


@pytest.mark.usefixtures("catalog")
def test_mesh_cutover_of_a_zone_zeroes_it_in_the_snapshot_and_rolls_back(client: TestClient, as_role: Any) -> None:
    op = as_role("operator")
    assert client.put("/api/v1/mesh-routes", json=SPLIT, headers=op).status_code == 200
    plan = client.post("/api/v1/cutovers", json={"scope": {"kind": "zone", "region": "eu", "name": "eu-a"},
                                                 "tier": "mesh", "reason": "eu-a packet loss"}, headers=op)
    assert plan.status_code == 201, plan.text
    (step,) = plan.json()["steps"]
    assert (step["tier"], step["driver"]) == ("mesh", "snapshot")
    assert _weights(_snapshot(client, as_role)) == {"v1@eu-a": 50, "v1@eu-b": 49, "v2@eu-a": 1}  # plan: no change
    done = client.post(f"/api/v1/cutovers/{plan.json()['id']}/execute", json={"idempotency_key": "k"}, headers=op)
    assert done.json()["state"] == "completed", done.text
    snapshot = _snapshot(client, as_role)
    assert _weights(snapshot) == {"v1@eu-a": 0, "v1@eu-b": 100, "v2@eu-a": 0}
    # What a gateway in eu makes of it: no v1 instance in eu-a, and no canary share left anywhere.
    assert gateway_mesh.zone_excluded(snapshot, region="eu", model="m", version="v1", zone="eu-a")
    assert not gateway_mesh.zone_excluded(snapshot, region="eu", model="m", version="v1", zone="eu-b")
    assert snapshot.mesh_routes[0].version_weights() == {"v1": 100, "v2": 0}
    evidence = client.get(f"/api/v1/cutovers/{plan.json()['id']}", headers=op).json()["steps"][0]["evidence"]
    assert evidence["in_snapshot"] and evidence["snapshot_version"] == snapshot.version
    back = client.post(f"/api/v1/cutovers/{plan.json()['id']}/rollback", json={"reason": "recovered"}, headers=op)
    assert back.json()["state"] == "rolled_back", back.text
    assert _weights(_snapshot(client, as_role)) == {"v1@eu-a": 50, "v1@eu-b": 49, "v2@eu-a": 1}
    kinds = [(e["kind"], e["routing_tier"]) for e in client.get(
        "/api/v1/events", params={"routing_tier": "mesh"}, headers=op).json()]
    assert ("cutover.step", "mesh") in kinds and ("cutover.rollback_step", "mesh") in kinds


@pytest.mark.usefixtures("catalog")
def test_mesh_cutover_of_a_zone_no_route_names_has_nothing_to_do(client: TestClient, as_role: Any) -> None:
    op = as_role("operator")
    assert client.put("/api/v1/mesh-routes", json=SPLIT, headers=op).status_code == 200
    plan = client.post("/api/v1/cutovers", json={"scope": {"kind": "zone", "region": "us", "name": "us-a"},
                                                 "tier": "mesh", "reason": "us-a"}, headers=op)
    assert (plan.status_code, plan.json()["error"]["type"]) == (422, "nothing_to_cut_over")
