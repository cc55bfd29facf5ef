"""Gateways report what they applied and ship their automatic L7 actions; both databases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from common.clock import ManualClock
from contract.events import DataPlaneEvent, EventBatch, GatewayReport, LiveEndpoint


def report(replica: str, version: int | None, at: datetime, **extra: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "replica_id": replica, "region": "eu", "zone": "eu-a", "snapshot_version": version,
        "snapshot_applied_at": at, "routing_source": "snapshot", "reported_at": at, "suppressed": 1,
        "live_endpoints": [LiveEndpoint(instance_id="e1", generation=3, version="v1", zone="eu-a")],
    }
    return GatewayReport(**{**fields, **extra}).model_dump(mode="json")


def test_gateways_report_and_stale_reports_are_never_shown_as_current(
    client: TestClient, as_role: Any, clock: ManualClock, session_factory: Any, settings: Any
) -> None:
    from controlplane.db import session_scope
    from controlplane.gateway_report import service

    gateway, viewer = as_role("gateway"), as_role("viewer")
    epoch = client.get("/api/v1/snapshot", headers=gateway).json()["controlplane_epoch"]
    assert client.put("/api/v1/gateways/gw-1", json=report("gw-1", 7, clock.utcnow(), snapshot_epoch=epoch),
                      headers=gateway).status_code == 200
    clock.advance(timedelta(seconds=20))
    assert client.put("/api/v1/gateways/gw-2", json=report("gw-2", 8, clock.utcnow(), snapshot_epoch=epoch),
                      headers=gateway).status_code == 200
    shown = {g["replica_id"]: g for g in client.get("/api/v1/gateways", headers=viewer).json()}
    assert (shown["gw-1"]["snapshot_version"], shown["gw-1"]["stale"], shown["gw-1"]["age_s"]) == (7, False, 20.0)
    assert [(e["instance_id"], e["generation"], e["version"], e["zone"]) for e in shown["gw-1"]["live_endpoints"]] == [
        ("e1", 3, "v1", "eu-a")]
    assert shown["gw-1"]["reported_by"] == "token:test-gateway#4"
    clock.advance(settings.gateway_report_stale_after - timedelta(seconds=10))  # gw-1 is now past the limit
    shown = {g["replica_id"]: g for g in client.get("/api/v1/gateways", headers=viewer).json()}
    assert (shown["gw-1"]["stale"], shown["gw-2"]["stale"]) == (True, False)
    with session_scope(session_factory) as session:
        assert service.applied_versions(session, region="eu", clock=clock,
                                        stale_after=settings.gateway_report_stale_after) == {"gw-1": None, "gw-2": 8}
    assert client.get("/api/v1/gateways", params={"region": "us"}, headers=viewer).json() == []


def test_a_version_from_another_epoch_is_shown_foreign_and_never_taken_as_applied(
    client: TestClient, as_role: Any, clock: ManualClock, session_factory: Any, settings: Any
) -> None:
    """A gateway that last applied another database's snapshot (higher versions) has applied nothing of ours."""
    from controlplane.db import session_scope
    from controlplane.gateway_report import service

    gateway, viewer = as_role("gateway"), as_role("viewer")
    snapshot = client.get("/api/v1/snapshot", headers=gateway).json()
    ours = snapshot["controlplane_epoch"]
    assert ours and snapshot["version"] == 0
    now = clock.utcnow()
    for replica, epoch in (("gw-ours", ours), ("gw-other", "0f0f0f0f-dead-4bee-8bad-000000000099"), ("gw-old", None)):
        put = client.put(f"/api/v1/gateways/{replica}", json=report(replica, 41, now, snapshot_epoch=epoch),
                         headers=gateway)
        assert put.status_code == 200 and put.json()["foreign_epoch"] is (epoch != ours)
    put = client.put("/api/v1/gateways/gw-static", json=report("gw-static", None, now, routing_source="static"),
                     headers=gateway)
    assert put.json()["foreign_epoch"] is False  # applied no snapshot: nothing to compare
    shown = {g["replica_id"]: g for g in client.get("/api/v1/gateways", headers=viewer).json()}
    assert {r: (g["snapshot_epoch"], g["foreign_epoch"]) for r, g in shown.items()} == {
        "gw-ours": (ours, False), "gw-other": ("0f0f0f0f-dead-4bee-8bad-000000000099", True), "gw-old": (None, True),
        "gw-static": (None, False)}
    with session_scope(session_factory) as session:
        assert service.applied_versions(session, region="eu", clock=clock,
                                        stale_after=settings.gateway_report_stale_after) == {
            "gw-ours": 41, "gw-other": None, "gw-old": None, "gw-static": None}


def test_a_newer_report_replaces_the_last_and_an_older_one_is_ignored(client: TestClient, as_role: Any,
                                                                      clock: ManualClock) -> None:
    gateway = as_role("gateway")
    now = clock.utcnow()
    client.put("/api/v1/gateways/gw-1", json=report("gw-1", 5, now), headers=gateway)
    client.put("/api/v1/gateways/gw-1", json=report("gw-1", 6, now + timedelta(seconds=1)), headers=gateway)
    late = client.put("/api/v1/gateways/gw-1", json=report("gw-1", 4, now - timedelta(seconds=1)), headers=gateway)
    assert late.status_code == 200 and late.json()["snapshot_version"] == 6
    assert [g["snapshot_version"] for g in client.get("/api/v1/gateways", headers=as_role("viewer")).json()] == [6]


def test_bad_reports_are_refused_and_only_gateways_report(client: TestClient, as_role: Any, clock: ManualClock) -> None:
    body = report("gw-1", 1, clock.utcnow())
    mismatch = client.put("/api/v1/gateways/gw-2", json=body, headers=as_role("gateway"))
    assert (mismatch.status_code, mismatch.json()["error"]["type"]) == (422, "invalid_request")
    extra = client.put("/api/v1/gateways/gw-1", json={**body, "surprise": 1}, headers=as_role("gateway"))
    assert extra.status_code == 422
    for role in ("viewer", "operator"):
        assert client.put("/api/v1/gateways/gw-1", json=body, headers=as_role(role)).status_code == 403
    assert client.get("/api/v1/gateways", headers=as_role("gateway")).status_code == 403
    assert client.get("/api/v1/gateways", headers=as_role("viewer")).json() == []


def batch(*events: DataPlaneEvent, dropped: int = 0) -> dict[str, Any]:
    return EventBatch(events=list(events), dropped=dropped).model_dump(mode="json")


def event(kind: str, instance: str, at: datetime, actor: str = "gateway:gw-1", **detail: Any) -> DataPlaneEvent:
    return DataPlaneEvent(kind=kind, actor=actor, region="eu", instance_id=instance, generation=3,  # type: ignore[arg-type]
                          reason="connect refused", at=at, detail=detail)


def test_dataplane_events_land_in_the_event_log_with_their_tier_actor_and_drops(
    client: TestClient, as_role: Any, clock: ManualClock
) -> None:
    at = datetime(2025, 12, 31, 23, 59, tzinfo=UTC)
    response = client.post("/api/v1/events/dataplane", headers=as_role("gateway"), json=batch(
        event("instance.suppressed", "e1", at, consecutive_5xx=5), event("generation.fenced", "e2", at), dropped=3))
    assert (response.status_code, response.json()) == (202, {"recorded": 3})
    client.patch("/api/v1/clusters/none", json={"weight": 1, "reason": "x"}, headers=as_role("operator"))  # 404, no event
    l7 = client.get("/api/v1/events", params={"routing_tier": "l7"}, headers=as_role("viewer")).json()
    assert [(e["kind"], e["actor"], e["scope"], e["outcome"]) for e in l7] == [
        ("instance.suppressed", "gateway:gw-1", "region:eu/instance:e1", "succeeded"),
        ("generation.fenced", "gateway:gw-1", "region:eu/instance:e2", "succeeded"),
        ("dataplane.events_dropped", "gateway:gw-1", "region:eu", "failed"),
    ]
    assert l7[0]["reason"] == "connect refused" and l7[0]["started_at"] == "2025-12-31T23:59:00Z"
    assert l7[0]["after"] == {"generation": 3, "consecutive_5xx": 5, "reported_by": "token:test-gateway#4"}
    assert l7[2]["after"]["dropped"] == 3
    by_actor = client.get("/api/v1/events", params={"actor": "gateway:gw-1"}, headers=as_role("viewer")).json()
    assert len(by_actor) == 3


def test_a_batch_with_a_foreign_actor_is_refused_whole(client: TestClient, as_role: Any, clock: ManualClock) -> None:
    at = clock.utcnow()
    for actor in ("operator:alice", "gateway:", "agent:eu"):
        response = client.post("/api/v1/events/dataplane", headers=as_role("gateway"),
                               json=batch(event("instance.suppressed", "e1", at), event("instance.suppressed", "e2", at,
                                                                                      actor=actor)))
        assert (response.status_code, response.json()["error"]["type"]) == (422, "invalid_request"), actor
    assert client.get("/api/v1/events", headers=as_role("viewer")).json() == []
    for role in ("viewer", "operator"):
        assert client.post("/api/v1/events/dataplane", headers=as_role(role), json=batch()).status_code == 403
    assert client.get("/api/v1/events", headers=as_role("gateway")).status_code == 403
    too_many = {"events": [batch(event("instance.suppressed", "e", at))["events"][0]] * 501, "dropped": 0}
    assert client.post("/api/v1/events/dataplane", headers=as_role("gateway"), json=too_many).status_code == 422


def test_nul_bytes_and_far_future_reports_are_refused_the_same_on_both_databases(
    client: TestClient, as_role: Any, clock: ManualClock
) -> None:
    gateway = as_role("gateway")
    at = clock.utcnow()
    nul_event = event("instance.suppressed", "e1", at, note="a\x00b")
    response = client.post("/api/v1/events/dataplane", headers=gateway, json=batch(nul_event))
    assert (response.status_code, response.json()["error"]["param"]) == (422, "events[0].detail.note")
    nul_report = client.put("/api/v1/gateways/gw-1", json=report("gw-1", 1, at, zone="a\x00"), headers=gateway)
    assert (nul_report.status_code, nul_report.json()["error"]["param"]) == (422, "zone")
    future = client.put("/api/v1/gateways/gw-1", json=report("gw-1", 1, at + timedelta(days=365)), headers=gateway)
    assert (future.status_code, future.json()["error"]["param"]) == (422, "reported_at")
    assert client.get("/api/v1/events", headers=as_role("viewer")).json() == []
    assert client.get("/api/v1/gateways", headers=as_role("viewer")).json() == []


@pytest.mark.parametrize("field", ["snapshot_version", "suppressed", "ejected"])
def test_a_number_past_the_databases_integer_is_a_422_not_a_500(
    client: TestClient, as_role: Any, clock: ManualClock, field: str
) -> None:
    """PostgreSQL's INTEGER is 32-bit, SQLite's 64: both must refuse at the door, before the insert overflows."""
    body = {**report("gw-1", 1, clock.utcnow()), field: 2**70}
    response = client.put("/api/v1/gateways/gw-1", json=body, headers=as_role("gateway"))
    assert response.status_code == 422, response.text
    assert client.get("/api/v1/gateways", headers=as_role("viewer")).json() == []


def test_an_oversized_body_is_refused_with_413_and_audited(client: TestClient, as_role: Any) -> None:
    huge = b'{"name": "eu", "description": "' + b"x" * (9 * 1024 * 1024) + b'"}'
    response = client.post("/api/v1/regions", content=huge, headers={**as_role("operator"),
                                                                      "Content-Type": "application/json"})
    assert (response.status_code, response.json()["error"]["type"]) == (413, "request_too_large")

    def chunks() -> Any:
        for _ in range(10):
            yield b"x" * (1024 * 1024)

    chunked = client.post("/api/v1/regions", content=chunks(), headers=as_role("operator"))
    assert chunked.status_code == 413
    assert client.get("/api/v1/regions", headers=as_role("viewer")).json() == []
    audit = client.get("/api/v1/audit", headers=as_role("admin")).json()
    assert [(a["actor"], a["status_code"]) for a in audit] == [("token:test-operator#2", 413)] * 2
