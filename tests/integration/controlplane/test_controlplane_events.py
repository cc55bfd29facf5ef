from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from common.clock import ManualClock


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
    since = (clock.utcnow() - timedelta(seconds=90)).isoformat()
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


def _replace_statements(dialect: str) -> list[str]:
    columns = "(id, kind, actor, reason, scope, outcome, started_at, ended_at)"
    values = "(:id, 'k', 'a', 'rewritten', 's', 'succeeded', :at, :at)"
    if dialect == "sqlite":
        return [f"INSERT OR REPLACE INTO events {columns} VALUES {values}", f"REPLACE INTO events {columns} VALUES {values}",
                f"INSERT INTO events {columns} VALUES {values} ON CONFLICT (id) DO UPDATE SET reason = 'rewritten'"]
    return [f"INSERT INTO events {columns} VALUES {values} ON CONFLICT (id) DO UPDATE SET reason = 'rewritten'"]


def test_database_refuses_replace_and_upsert_of_an_event(session_factory: Any, db_engine: Any,
                                                         clock: ManualClock) -> None:
    """SQLite's REPLACE deletes the old row without firing DELETE triggers; a BEFORE INSERT trigger refuses it."""
    from sqlalchemy import text
    from sqlalchemy.exc import IntegrityError

    event_id = _one_event(session_factory, clock)
    for statement in _replace_statements(db_engine.dialect.name):
        with pytest.raises(IntegrityError, match="append-only"), db_engine.begin() as conn:
            conn.execute(text(statement), {"id": event_id, "at": clock.utcnow()})
    with db_engine.connect() as conn:
        rows = conn.execute(text("SELECT id, reason FROM events")).all()
    assert [tuple(r) for r in rows] == [(event_id, "kept")]
    with db_engine.begin() as conn:  # a new id still goes in, even named explicitly
        conn.execute(text(_replace_statements("postgresql")[0].split(" ON CONFLICT")[0]),
                     {"id": event_id + 1, "at": clock.utcnow()})


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


def _many_events(session_factory: Any, clock: ManualClock, count: int) -> None:
    from controlplane.db import session_scope
    from controlplane.event import service

    with session_scope(session_factory) as session:
        for index in range(count):
            service.record(session, kind="test.fact", actor="t", reason=str(index),
                           scope=f"test:{'even' if index % 2 == 0 else 'odd'}", clock=clock)


def test_events_export_streams_every_event_across_pages(client: TestClient, as_role: Any, session_factory: Any,
                                                         clock: ManualClock) -> None:
    _many_events(session_factory, clock, 1203)  # export pages hold 500
    response = client.get("/api/v1/events/export", headers=as_role("viewer"))
    assert response.status_code == 200
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert [e["reason"] for e in lines] == [str(i) for i in range(1203)]
    assert [e["id"] for e in lines] == sorted(e["id"] for e in lines)
    odd = client.get("/api/v1/events/export", params={"scope": "test:odd"}, headers=as_role("viewer"))
    assert len(odd.text.splitlines()) == 601
    bad = client.get("/api/v1/events/export", params={"since": "yesterday"}, headers=as_role("viewer"))
    assert (bad.status_code, bad.json()["error"]["type"]) == (422, "invalid_request")


def test_export_stream_reads_a_page_at_a_time_and_closes_its_session(
    session_factory: Any, db_engine: Any, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from controlplane.event import repository, service
    from controlplane.event.repository import EventFilter

    _many_events(session_factory, clock, 7)
    pages: list[int] = []
    real = repository.list_events

    def counting(*args: Any, **kwargs: Any) -> Any:
        pages.append(kwargs["limit"])
        return real(*args, **kwargs)

    monkeypatch.setattr(repository, "list_events", counting)
    stream = service.stream_jsonl(session_factory, EventFilter(), page=3)
    assert pages == []  # nothing read before the first line is asked for
    first = next(stream)
    assert json.loads(first)["reason"] == "0" and len(pages) == 1
    rest = list(stream)
    assert len(rest) == 6 and len(pages) == 3  # 3 + 3 + 1
    assert db_engine.pool.checkedout() == 0


def test_export_stream_that_fails_midway_ends_with_a_typed_error_line(
    session_factory: Any, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy.exc import OperationalError

    from controlplane.event import repository, service
    from controlplane.event.repository import EventFilter

    _many_events(session_factory, clock, 5)
    real = repository.list_events
    calls: list[int] = []

    def failing_second_page(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise OperationalError("SELECT", {}, Exception("connection lost"))
        return real(*args, **kwargs)

    monkeypatch.setattr(repository, "list_events", failing_second_page)
    lines = [json.loads(line) for line in service.stream_jsonl(session_factory, EventFilter(), page=2)]
    assert [e.get("reason") for e in lines[:2]] == ["0", "1"]
    assert lines[2:] == [{"error": {"type": "export_failed", "message": "the export stopped early", "param": None, "code": None}}]


def test_anycast_events_are_stored_and_found_under_anycast(client: TestClient, as_role: Any, session_factory: Any,
                                                          clock: ManualClock) -> None:
    """Invariant 8 names the zone tier `anycast`; the log stores and filters it by that name (migration 0009)."""
    from contract.routing_tier import RoutingTier
    from controlplane.event import service

    with session_factory.begin() as session:
        service.record(session, kind="cutover.step", routing_tier=RoutingTier.ANYCAST, actor="operator:test",
                       reason="zone eu-a lost power", scope="region:eu/zone:eu-a", clock=clock)
    viewer = as_role("viewer")
    found = client.get("/api/v1/events", params={"routing_tier": "anycast"}, headers=viewer).json()
    assert [(e["kind"], e["routing_tier"]) for e in found] == [("cutover.step", "anycast")]
    assert client.get("/api/v1/events", params={"routing_tier": "zone"}, headers=viewer).status_code == 422
