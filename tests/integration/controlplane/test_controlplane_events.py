from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from controlplane.clock import ManualClock

pytestmark = pytest.mark.integration


@pytest.fixture
def history(client: TestClient, as_role: Any, clock: ManualClock) -> None:
    op = as_role("operator")
    client.post("/api/v1/regions", json={"name": "eu"}, headers=op)
    clock.advance(timedelta(minutes=1))
    client.post("/api/v1/clusters", json={"name": "eu-a", "region": "eu", "model": "m"}, headers=op)
    clock.advance(timedelta(minutes=1))
    client.patch("/api/v1/clusters/eu-a", json={"weight": 5, "reason": "shed", "routing_tier": "mesh"}, headers=op)
    clock.advance(timedelta(minutes=1))
    client.patch("/api/v1/clusters/eu-a", json={"state": "ejected", "reason": "dead", "routing_tier": "l7"}, headers=op)


def test_events_filter_by_kind_tier_scope_and_time(client: TestClient, as_role: Any, history: None,
                                                   clock: ManualClock) -> None:
    viewer = as_role("viewer")

    def kinds(**params: Any) -> list[str]:
        response = client.get("/api/v1/events", params=params, headers=viewer)
        assert response.status_code == 200, response.text
        return [e["kind"] for e in response.json()]

    assert kinds() == ["topology.region.create", "topology.cluster.create", "topology.cluster.update",
                       "topology.cluster.update"]
    assert kinds(routing_tier="mesh") == ["topology.cluster.update"]
    assert kinds(scope="region:eu/cluster:") == ["topology.cluster.create"] + ["topology.cluster.update"] * 2
    assert kinds(kind="topology.region.create") == ["topology.region.create"]
    since = (clock.now() - timedelta(seconds=90)).isoformat()
    assert kinds(since=since) == ["topology.cluster.update"] * 2
    assert kinds(scope="region:eu%") == []  # LIKE wildcards are literal
    bad = client.get("/api/v1/events", params={"routing_tier": "bgp"}, headers=viewer)
    assert (bad.status_code, bad.json()["error"]["type"]) == (422, "invalid_request")


def test_events_export_as_json_lines(client: TestClient, as_role: Any, history: None) -> None:
    response = client.get("/api/v1/events/export", params={"kind": "topology.cluster.update"},
                          headers=as_role("viewer"))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert [(e["routing_tier"], e["reason"], e["after"]["revision"]) for e in lines] == [("mesh", "shed", 2),
                                                                                        ("l7", "dead", 3)]
    assert lines[1]["before"]["state"] == "active" and lines[1]["after"]["state"] == "ejected"


def test_event_log_has_no_update_or_delete_routes(client: TestClient, as_role: Any, history: None) -> None:
    admin = as_role("admin")
    first = client.get("/api/v1/events", headers=admin).json()[0]
    for method in ("PUT", "PATCH", "DELETE"):
        response = client.request(method, f"/api/v1/events/{first['id']}", headers=admin)
        assert response.status_code in (404, 405)
    assert client.get("/api/v1/events", headers=admin).json()[0] == first


def _one_event(session_factory: Any, clock: ManualClock) -> int:
    from controlplane.db import session_scope
    from controlplane.event import service

    with session_scope(session_factory) as session:
        return service.record(session, kind="test.fact", actor="t", reason="kept", scope="test:1", clock=clock).id


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE events SET reason = 'rewritten' WHERE id = :id",
        "UPDATE events SET routing_tier = NULL",
        "DELETE FROM events WHERE id = :id",
        "DELETE FROM events",
    ],
)
def test_database_refuses_update_and_delete_of_events(
    session_factory: Any, db_engine: Any, clock: ManualClock, statement: str
) -> None:
    from sqlalchemy import text
    from sqlalchemy.exc import IntegrityError

    event_id = _one_event(session_factory, clock)
    with pytest.raises(IntegrityError, match="append-only"), db_engine.begin() as conn:
        conn.execute(text(statement), {"id": event_id})
    with db_engine.connect() as conn:
        rows = conn.execute(text("SELECT id, reason FROM events")).all()
    assert [tuple(r) for r in rows] == [(event_id, "kept")]


def test_orm_cannot_change_an_event_and_inserts_still_work(session_factory: Any, db_engine: Any,
                                                          clock: ManualClock) -> None:
    from sqlalchemy.exc import IntegrityError

    from controlplane.event.models import Event
    from tests.support.controlplane_testing import clean_tables

    event_id = _one_event(session_factory, clock)
    session = session_factory()
    try:
        session.get(Event, event_id).reason = "rewritten"
        with pytest.raises(IntegrityError):
            session.commit()
        session.rollback()
        session.delete(session.get(Event, event_id))
        with pytest.raises(IntegrityError):
            session.commit()
    finally:
        session.close()
    # The test cleaner empties the table without lifting the guard for good.
    clean_tables(db_engine)
    second = _one_event(session_factory, clock)
    session = session_factory()
    try:
        session.get(Event, second).reason = "rewritten"
        with pytest.raises(IntegrityError):
            session.commit()
    finally:
        session.close()
