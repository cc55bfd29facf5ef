from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from common.clock import ManualClock
from contract.lease import Lease
from controlplane.topology.lease import InMemoryLeaseReader


@pytest.fixture
def declared(client: TestClient, as_role: Any) -> None:
    op = as_role("operator")
    assert client.post("/api/v1/regions", json={"name": "eu-west", "description": "primary"}, headers=op).status_code == 201
    assert client.post("/api/v1/regions/eu-west/zones", json={"name": "eu-west-1a"}, headers=op).status_code == 201
    body = {"name": "eu-a", "region": "eu-west", "zone": "eu-west-1a", "model": "llama", "weight": 100}
    assert client.post("/api/v1/clusters", json=body, headers=op).status_code == 201


def test_declared_topology_reads_back(client: TestClient, as_role: Any, declared: None) -> None:
    regions = client.get("/api/v1/regions", headers=as_role("viewer")).json()
    assert [(r["name"], r["zones"]) for r in regions] == [("eu-west", ["eu-west-1a"])]
    cluster = client.get("/api/v1/clusters/eu-a", headers=as_role("viewer")).json()
    assert (cluster["model"], cluster["weight"], cluster["state"], cluster["revision"]) == ("llama", 100, "active", 1)


def test_duplicates_conflict_and_unknown_parents_are_404(client: TestClient, as_role: Any, declared: None) -> None:
    op = as_role("operator")
    dup = client.post("/api/v1/regions", json={"name": "eu-west"}, headers=op)
    assert (dup.status_code, dup.json()["error"]["type"]) == (409, "already_exists")
    missing = client.post("/api/v1/regions/nowhere/zones", json={"name": "z"}, headers=op)
    assert (missing.status_code, missing.json()["error"]["type"]) == (404, "region_not_found")
    bad_zone = client.post(
        "/api/v1/clusters", json={"name": "c2", "region": "eu-west", "zone": "nope", "model": "llama"}, headers=op
    )
    assert (bad_zone.status_code, bad_zone.json()["error"]["type"]) == (404, "zone_not_found")
    assert len(client.get("/api/v1/clusters", headers=op).json()) == 1


@pytest.mark.parametrize(
    "body",
    [
        {"name": "has space", "region": "eu-west", "model": "llama"},
        {"name": "c", "region": "eu-west", "model": "llama", "weight": -1},
        {"name": "c", "region": "eu-west", "model": "llama", "weight": "heavy"},
        {"name": "c\x00", "region": "eu-west", "model": "llama"},
        {"region": "eu-west", "model": "llama"},
    ],
)
def test_bad_input_is_422_and_changes_nothing(client: TestClient, as_role: Any, declared: None, body: dict) -> None:
    before_events = client.get("/api/v1/events", headers=as_role("viewer")).json()
    before_snapshot = client.get("/api/v1/snapshot", headers=as_role("viewer")).json()
    response = client.post("/api/v1/clusters", json=body, headers=as_role("operator"))
    assert response.status_code == 422
    assert response.json()["error"]["type"] == "invalid_request"
    assert [c["name"] for c in client.get("/api/v1/clusters", headers=as_role("viewer")).json()] == ["eu-a"]
    assert client.get("/api/v1/events", headers=as_role("viewer")).json() == before_events
    assert client.get("/api/v1/snapshot", headers=as_role("viewer")).json() == before_snapshot


def test_drain_writes_event_with_tier_and_before_after(client: TestClient, as_role: Any, declared: None) -> None:
    response = client.patch(
        "/api/v1/clusters/eu-a",
        json={"state": "draining", "reason": "zone maintenance", "routing_tier": "anycast", "expected_revision": 1},
        headers=as_role("operator"),
    )
    assert response.status_code == 200
    assert (response.json()["state"], response.json()["revision"]) == ("draining", 2)
    events = client.get("/api/v1/events", params={"kind": "topology.cluster.update"}, headers=as_role("viewer")).json()
    assert len(events) == 1
    event = events[0]
    assert event["routing_tier"] == "anycast"
    assert event["reason"] == "zone maintenance"
    assert event["actor"].startswith("token:test-operator#")
    assert event["scope"] == "region:eu-west/cluster:eu-a"
    assert event["before"] == {"weight": 100, "state": "active", "revision": 1}
    assert event["after"] == {"weight": 100, "state": "draining", "revision": 2}
    assert event["started_at"] <= event["ended_at"]


def test_stale_revision_is_refused_and_changes_nothing(client: TestClient, as_role: Any, declared: None) -> None:
    op = as_role("operator")
    assert client.patch("/api/v1/clusters/eu-a", json={"weight": 50, "reason": "r"}, headers=op).status_code == 200
    stale = client.patch("/api/v1/clusters/eu-a", json={"weight": 0, "reason": "r", "expected_revision": 1}, headers=op)
    assert (stale.status_code, stale.json()["error"]["type"]) == (409, "cluster_conflict")
    assert client.get("/api/v1/clusters/eu-a", headers=op).json()["weight"] == 50


def test_observed_instances_liveness_is_computed_at_read_time(
    client: TestClient, as_role: Any, declared: None, clock: ManualClock, lease_reader: InMemoryLeaseReader
) -> None:
    lease_reader.put(Lease(
        instance_id="engine-a", generation=3, url="http://10.0.0.1:8000", version="v1", zone="eu-west-1a",
        region="eu-west", expires_at=clock.wall() + 10,
    ))
    op = as_role("operator")
    assert client.post(
        "/api/v1/regions/eu-west/ejections", json={"instance_id": "engine-a", "generation": 2, "reason": "old"}, headers=op
    ).status_code == 201
    first = client.get("/api/v1/regions/eu-west/instances", headers=op).json()
    assert [(i["instance_id"], i["generation"], i["live"], i["ejected"]) for i in first] == [("engine-a", 3, True, False)]
    clock.advance(timedelta(seconds=11))
    later = client.get("/api/v1/regions/eu-west/instances", headers=op).json()
    assert later[0]["live"] is False
    assert client.get("/api/v1/regions/nowhere/instances", headers=op).status_code == 404


def _snapshot_version(client: TestClient, headers: dict[str, str]) -> int:
    return client.get("/api/v1/snapshot", headers=headers).json()["version"]


def test_cluster_is_deleted_only_once_ejected(client: TestClient, as_role: Any, declared: None) -> None:
    op = as_role("operator")
    before = client.get("/api/v1/clusters/eu-a", headers=op).json()
    version = _snapshot_version(client, op)
    for state in ("active", "draining"):
        if state == "draining":
            client.patch("/api/v1/clusters/eu-a", json={"state": "draining", "reason": "r"}, headers=op)
            before = client.get("/api/v1/clusters/eu-a", headers=op).json()
            version = _snapshot_version(client, op)
        refused = client.delete("/api/v1/clusters/eu-a", params={"reason": "retire"}, headers=op)
        assert (refused.status_code, refused.json()["error"]["type"]) == (409, "cluster_in_service")
        assert client.get("/api/v1/clusters/eu-a", headers=op).json() == before
        assert _snapshot_version(client, op) == version

    client.patch("/api/v1/clusters/eu-a", json={"state": "ejected", "reason": "retire"}, headers=op)
    stale = client.delete("/api/v1/clusters/eu-a", params={"reason": "retire", "expected_revision": 1}, headers=op)
    assert (stale.status_code, stale.json()["error"]["type"]) == (409, "cluster_conflict")
    version = _snapshot_version(client, op)
    deleted = client.delete("/api/v1/clusters/eu-a", params={"reason": "retired"}, headers=op)
    assert deleted.status_code == 204
    assert client.get("/api/v1/clusters/eu-a", headers=op).json()["error"]["type"] == "cluster_not_found"
    snapshot = client.get("/api/v1/snapshot", headers=op).json()
    assert snapshot["version"] == version + 1 and snapshot["clusters"] == [] and snapshot["ejected_clusters"] == []
    event = client.get("/api/v1/events", params={"kind": "topology.cluster.delete"}, headers=op).json()
    assert [(e["reason"], e["before"]["state"], e["after"]) for e in event] == [("retired", "ejected", None)]
    again = client.delete("/api/v1/clusters/eu-a", params={"reason": "r"}, headers=op)
    assert (again.status_code, again.json()["error"]["type"]) == (404, "cluster_not_found")


@pytest.mark.parametrize(
    "params",
    [{}, {"reason": ""}, {"reason": "r", "expected_revision": -1}, {"reason": "r", "expected_revision": "x"}],
)
def test_delete_with_bad_input_is_422_and_changes_nothing(client: TestClient, as_role: Any, declared: None,
                                                          params: dict) -> None:
    op = as_role("operator")
    paths = ["/api/v1/clusters/eu-a"] + (["/api/v1/regions/eu-west"] if "expected_revision" not in params else [])
    for path in paths:
        response = client.delete(path, params=params, headers=op)
        assert (response.status_code, response.json()["error"]["type"]) == (422, "invalid_request"), path
    assert client.get("/api/v1/clusters/eu-a", headers=op).status_code == 200
    assert client.get("/api/v1/regions/eu-west", headers=op).status_code == 200
    viewer = client.delete("/api/v1/clusters/eu-a", params={"reason": "r"}, headers=as_role("viewer"))
    assert viewer.status_code == 403


def test_region_is_deleted_only_when_empty_and_takes_its_zones(
    client: TestClient, as_role: Any, declared: None, lease_reader: InMemoryLeaseReader, clock: ManualClock
) -> None:
    op = as_role("operator")

    def refused_because() -> str:
        response = client.delete("/api/v1/regions/eu-west", params={"reason": "close"}, headers=op)
        assert (response.status_code, response.json()["error"]["type"]) == (409, "region_not_empty")
        assert client.get("/api/v1/regions/eu-west", headers=op).json()["zones"] == ["eu-west-1a"]
        return response.json()["error"]["message"]

    assert "eu-a" in refused_because()
    client.patch("/api/v1/clusters/eu-a", json={"state": "ejected", "reason": "r"}, headers=op)
    assert client.delete("/api/v1/clusters/eu-a", params={"reason": "r"}, headers=op).status_code == 204

    client.post("/api/v1/regions/eu-west/ejections", json={"instance_id": "e1", "generation": 1, "reason": "r"},
                headers=op)
    assert "ejection" in refused_because()
    ejection_id = client.get("/api/v1/regions/eu-west/ejections", headers=op).json()[0]["id"]
    client.delete(f"/api/v1/regions/eu-west/ejections/{ejection_id}", params={"reason": "r"}, headers=op)

    lease_reader.put(Lease(
        instance_id="e2", generation=1, url="http://e2", version="v1", zone="eu-west-1a", region="eu-west",
        expires_at=clock.wall() + 10,
    ))
    assert "e2" in refused_because()
    clock.advance(timedelta(seconds=11))  # the lease lapses: no longer live

    version = _snapshot_version(client, op)
    deleted = client.delete("/api/v1/regions/eu-west", params={"reason": "closed"}, headers=op)
    assert deleted.status_code == 204, deleted.text
    assert client.get("/api/v1/regions", headers=op).json() == []
    assert _snapshot_version(client, op) == version  # regions are not in the snapshot
    events = client.get("/api/v1/events", params={"kind": "topology.region.delete"}, headers=op).json()
    assert [(e["reason"], e["before"]) for e in events] == [("closed", {"name": "eu-west", "zones": ["eu-west-1a"]})]
    # The name is free again, zones included.
    assert client.post("/api/v1/regions", json={"name": "eu-west"}, headers=op).status_code == 201
    assert client.post("/api/v1/regions/eu-west/zones", json={"name": "eu-west-1a"}, headers=op).status_code == 201
    missing = client.delete("/api/v1/regions/nowhere", params={"reason": "r"}, headers=op)
    assert (missing.status_code, missing.json()["error"]["type"]) == (404, "region_not_found")
