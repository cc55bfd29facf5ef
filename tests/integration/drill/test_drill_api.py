"""Drill definitions, runs, approval and cadence through the API, on SQLite and on PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest

from controlplane.celery_app import DRILL_CADENCE_ENTRY, create_celery
from controlplane.db import session_scope
from controlplane.drill import service
from controlplane.drill.errors import ApprovalRequired, DrillRunChanged, InvalidTransition
from controlplane.drill.states import DrillRunEvent

INSTANCE = {"name": "kill-one", "model": "tiny", "scope": "instance", "fault": "sigkill",
            "blast_radius": {"region": "local", "instances": ["victim"]}}
ZONE = {"name": "lose-zone-a", "model": "tiny", "scope": "zone", "fault": "zone_loss",
        "blast_radius": {"region": "local", "zones": ["local-a"], "max_instances": 4}}
REGION = {"name": "lose-region", "model": "tiny", "scope": "region", "fault": "region_loss",
          "blast_radius": {"region": "local"}}


def define(client, as_role, body):
    response = client.post("/api/v1/drills", json=body, headers=as_role("operator"))
    assert response.status_code == 201, response.text
    return response.json()


def request_run(client, as_role, name):
    response = client.post(f"/api/v1/drills/{name}/runs", headers=as_role("operator"))
    assert response.status_code == 201, response.text
    return response.json()


def test_defining_a_name_again_adds_a_version(client, as_role):
    assert define(client, as_role, INSTANCE)["version"] == 1
    second = define(client, as_role, {**INSTANCE, "targets": {"request_rto_s": 2.0}})
    assert second["version"] == 2
    listed = client.get("/api/v1/drills", headers=as_role("viewer")).json()
    assert [(d["name"], d["version"]) for d in listed] == [("kill-one", 2)]
    first = client.get("/api/v1/drills/kill-one", params={"version": 1}, headers=as_role("viewer")).json()
    assert first["targets"]["request_rto_s"] is None
    assert client.get("/api/v1/drills/nope", headers=as_role("viewer")).json()["error"]["type"] == "drill_not_found"


def test_bad_definitions_are_refused_and_change_nothing(client, as_role):
    for body in ({**INSTANCE, "fault": "zone_loss"}, {**INSTANCE, "blast_radius": {"region": "local"}},
                 {**INSTANCE, "stop_conditions": {"max_error_rate": 2}}):
        response = client.post("/api/v1/drills", json=body, headers=as_role("operator"))
        assert response.status_code == 422 and response.json()["error"]["type"] == "invalid_request"
    assert client.get("/api/v1/drills", headers=as_role("viewer")).json() == []


def test_a_viewer_cannot_define_or_run(client, as_role):
    define(client, as_role, INSTANCE)
    assert client.post("/api/v1/drills", json=INSTANCE, headers=as_role("viewer")).status_code == 403
    assert client.post("/api/v1/drills/kill-one/runs", headers=as_role("viewer")).status_code == 403


def test_an_instance_run_is_scheduled_and_a_zone_run_waits_for_approval(client, as_role, session_factory, clock):
    define(client, as_role, INSTANCE)
    define(client, as_role, ZONE)
    instance_run = request_run(client, as_role, "kill-one")
    zone_run = request_run(client, as_role, "lose-zone-a")
    assert instance_run["state"] == "scheduled" and instance_run["trigger"] == "manual"
    assert zone_run["state"] == "awaiting_approval"
    # Nothing can start it before a person approves.
    with pytest.raises(InvalidTransition), session_scope(session_factory) as session:
        service.start(session, run_id=zone_run["id"], fault_target="local-a", actor="t", clock=clock)
    approved = client.post(f"/api/v1/drills/runs/{zone_run['id']}/approve", headers=as_role("operator"))
    assert approved.status_code == 200, approved.text
    assert approved.json()["state"] == "scheduled" and approved.json()["approved_by"].startswith("token:")
    again = client.post(f"/api/v1/drills/runs/{zone_run['id']}/approve", headers=as_role("operator"))
    assert again.status_code == 409 and again.json()["error"]["type"] == "invalid_transition"
    with session_scope(session_factory) as session:
        started = service.start(session, run_id=zone_run["id"], fault_target="local-a", actor="t", clock=clock)
        assert started.state == "running"
    events = client.get("/api/v1/events", params={"kind": "drill.approved"}, headers=as_role("viewer")).json()
    assert len(events) == 1


def test_a_scheduled_region_run_without_an_approver_cannot_start(session_factory, client, as_role, clock):
    define(client, as_role, REGION)
    run = request_run(client, as_role, "lose-region")
    with session_scope(session_factory) as session:
        # A row put in `scheduled` by hand, with nobody's approval: the guard still refuses it.
        from controlplane.drill import repository

        assert repository.compare_and_set(session, run_id=run["id"], expected_state="awaiting_approval",
                                          expected_revision=1, state="scheduled")
    with pytest.raises(ApprovalRequired), session_scope(session_factory) as session:
        service.start(session, run_id=run["id"], fault_target="local", actor="t", clock=clock)


def test_abort_is_final(client, as_role):
    define(client, as_role, INSTANCE)
    run = request_run(client, as_role, "kill-one")
    body = {"reason": "change freeze"}
    aborted = client.post(f"/api/v1/drills/runs/{run['id']}/abort", json=body, headers=as_role("operator"))
    assert aborted.json()["state"] == "aborted" and aborted.json()["abort_reason"] == "change freeze"
    again = client.post(f"/api/v1/drills/runs/{run['id']}/abort", json=body, headers=as_role("operator"))
    assert again.status_code == 409
    listed = client.get("/api/v1/drills/runs", params={"state": "aborted"}, headers=as_role("viewer")).json()
    assert [r["id"] for r in listed] == [run["id"]]
    assert client.get("/api/v1/drills/runs/999", headers=as_role("viewer")).status_code == 404


def test_compare_and_set_has_one_winner(client, as_role, session_factory, clock):
    define(client, as_role, INSTANCE)
    run = request_run(client, as_role, "kill-one")
    with session_scope(session_factory) as session:
        stale = service.get_run_or_raise(session, run_id=run["id"])  # a runner read it: scheduled, revision 1
    with session_scope(session_factory) as session:
        service.abort(session, run_id=run["id"], reason="operator", actor="a", clock=clock)
    with pytest.raises(DrillRunChanged), session_scope(session_factory) as session:
        service.advance(session, run=stale, event=DrillRunEvent.START, clock=clock)
    with session_scope(session_factory) as session:
        assert service.get_run_or_raise(session, run_id=run["id"]).state == "aborted"


def test_weekly_cadence_fires_under_a_fake_clock(client, as_role, session_factory, clock, settings):
    define(client, as_role, INSTANCE)
    define(client, as_role, ZONE)
    beat = create_celery(settings, clock=clock).conf.beat_schedule[DRILL_CADENCE_ENTRY]["schedule"]
    last_beat = clock.utcnow()

    def beat_tick() -> list[tuple[str, str]]:
        with session_scope(session_factory) as session:
            return [(r.definition.name, r.state) for r in service.schedule_due(session, clock=clock)]

    assert sorted(beat_tick()) == [("kill-one", "scheduled"), ("lose-zone-a", "awaiting_approval")]
    with session_scope(session_factory) as session:
        for run in service.list_runs(session, name="kill-one"):
            service.abort(session, run_id=run.id, reason="done", actor="t", clock=clock)
    clock.advance(timedelta(minutes=59))
    assert not beat.is_due(last_beat).is_due  # beat's own due-check, on the injected clock
    clock.advance(timedelta(minutes=1))
    assert beat.is_due(last_beat).is_due
    clock.advance(timedelta(days=6, hours=22))
    assert beat_tick() == []  # six days and 23 hours: not yet a week; the zone run still awaits approval
    clock.advance(timedelta(hours=1))
    assert beat_tick() == [("kill-one", "scheduled")]
    assert beat_tick() == []  # an open run is not scheduled twice
    with session_scope(session_factory) as session:
        assert {r.trigger for r in service.list_runs(session, name="kill-one")} == {"schedule"}


def test_drill_events_name_what_they_faulted_and_an_instances_generation(client, as_role, session_factory, clock):
    define(client, as_role, INSTANCE)
    define(client, as_role, ZONE)
    instance_run = request_run(client, as_role, "kill-one")
    zone_run = request_run(client, as_role, "lose-zone-a")
    assert client.post(f"/api/v1/drills/runs/{zone_run['id']}/approve", headers=as_role("operator")).status_code == 200
    with session_scope(session_factory) as session:
        service.start(session, run_id=instance_run["id"], fault_target="victim", actor="t", clock=clock,
                      fault_generation=4)
        service.start(session, run_id=zone_run["id"], fault_target="local-a", actor="t", clock=clock,
                      fault_generation=9)  # a zone has no one generation: not kept
        service.abort(session, run_id=instance_run["id"], reason="stop", actor="t", clock=clock)
    started = client.get("/api/v1/events", params={"kind": "drill.started"}, headers=as_role("viewer")).json()
    by_run = {e["after"]["run"]: e for e in started}
    assert by_run[instance_run["id"]]["scope"] == "region:local/instance:victim"
    assert by_run[instance_run["id"]]["after"]["generation"] == 4
    assert by_run[zone_run["id"]]["scope"] == "region:local/zone:local-a"  # once mislabelled as an instance
    assert "generation" not in by_run[zone_run["id"]]["after"]
    (aborted,) = client.get("/api/v1/events", params={"kind": "drill.aborted"}, headers=as_role("viewer")).json()
    assert (aborted["scope"], aborted["after"]["generation"]) == ("region:local/instance:victim", 4)
    shown = client.get(f"/api/v1/drills/runs/{instance_run['id']}", headers=as_role("viewer")).json()
    assert shown["fault_generation"] == 4


def test_metrics_say_when_each_drill_last_passed_and_when_a_passing_run_is_due(client, as_role, session_factory,
                                                                                clock):
    """What LifelineDrillOverdue reads, from the database through the API's own /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    def gauges() -> dict[tuple[str, str], float]:
        page = client.get("/metrics").text
        return {(sample.name.removeprefix("lifeline_controlplane_drill_"), sample.labels["drill"]): sample.value
                for family in text_string_to_metric_families(page) for sample in family.samples
                if sample.name.startswith("lifeline_controlplane_drill_") and "drill" in sample.labels}

    day = 86400.0
    define(client, as_role, INSTANCE)
    define(client, as_role, ZONE)
    defined = clock.wall()
    seen = gauges()
    assert seen[("cadence_seconds", "kill-one")] == 7 * day and seen[("cadence_seconds", "lose-zone-a")] == 30 * day
    assert seen[("pass_due_timestamp_seconds", "kill-one")] == defined + 7 * day  # due from the definition on
    assert ("last_passed_timestamp_seconds", "kill-one") not in seen  # never passed
    clock.advance(timedelta(days=3))
    run = request_run(client, as_role, "kill-one")
    with session_scope(session_factory) as session:
        started = service.start(session, run_id=run["id"], fault_target="victim", actor="t", clock=clock)
        measuring = service.advance(session, run=started, event=DrillRunEvent.FAULT_CLEARED, clock=clock)
        service.advance(session, run=measuring, event=DrillRunEvent.PASS, clock=clock)
    passed = clock.wall()
    clock.advance(timedelta(days=1))
    define(client, as_role, {**INSTANCE, "targets": {"request_rto_s": 2.0}})  # a new version keeps the history
    seen = gauges()
    assert seen[("last_passed_timestamp_seconds", "kill-one")] == passed
    assert seen[("pass_due_timestamp_seconds", "kill-one")] == passed + 7 * day
    assert seen[("pass_due_timestamp_seconds", "lose-zone-a")] == defined + 30 * day
    assert client.get("/metrics").text.count("lifeline_controlplane_drill_scrape_ok 1.0") == 1
