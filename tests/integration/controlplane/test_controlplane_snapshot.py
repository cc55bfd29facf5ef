from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

pytestmark = pytest.mark.integration


def test_snapshot_version_grows_with_each_routing_change_and_etag_gives_304(client: TestClient, as_role: Any) -> None:
    viewer, op = as_role("viewer"), as_role("operator")
    first = client.get("/api/v1/snapshot", headers=viewer)
    assert first.status_code == 200
    assert first.json()["version"] == 0
    etag = first.headers["etag"]
    unchanged = client.get("/api/v1/snapshot", headers={**viewer, "If-None-Match": etag})
    assert unchanged.status_code == 304
    assert unchanged.content == b""

    client.post("/api/v1/regions", json={"name": "us-east"}, headers=op)
    client.post("/api/v1/clusters", json={"name": "us-a", "region": "us-east", "model": "llama", "weight": 70}, headers=op)
    client.post("/api/v1/clusters", json={"name": "us-b", "region": "us-east", "model": "llama", "weight": 30}, headers=op)
    client.patch("/api/v1/clusters/us-b", json={"state": "draining", "reason": "r"}, headers=op)
    client.post("/api/v1/regions/us-east/ejections", json={"instance_id": "e1", "generation": 4, "reason": "r"}, headers=op)

    changed = client.get("/api/v1/snapshot", headers={**viewer, "If-None-Match": etag})
    assert changed.status_code == 200
    body = changed.json()
    assert body["version"] == 4
    assert changed.headers["etag"] != etag
    assert body["tier_weights"] == {"llama": {"us-east": {"*": 70}}}
    assert body["drains"] == ["us-b"]
    assert body["ejections"] == [{"region": "us-east", "instance_id": "e1", "generation": 4, "reason": "r"}]

    versions = [body["version"]]
    for weight in (10, 20):
        client.patch("/api/v1/clusters/us-a", json={"weight": weight, "reason": "shift"}, headers=op)
        versions.append(client.get("/api/v1/snapshot", headers=viewer).json()["version"])
    assert versions == sorted(set(versions))


def test_failed_change_does_not_advance_the_snapshot(client: TestClient, as_role: Any) -> None:
    op = as_role("operator")
    client.post("/api/v1/regions", json={"name": "us-east"}, headers=op)
    before = client.get("/api/v1/snapshot", headers=op).json()["version"]
    assert client.patch("/api/v1/clusters/ghost", json={"weight": 1, "reason": "r"}, headers=op).status_code == 404
    assert client.post("/api/v1/clusters", json={"name": "c", "region": "gone", "model": "m"}, headers=op).status_code == 404
    assert client.get("/api/v1/snapshot", headers=op).json()["version"] == before
