"""Alertmanager's webhook: each alert acts once by its route, from a known source only; both databases.

The real Prometheus → Alertmanager → control plane path is
tests/e2e/alerts/test_alertmanager_delivers.py; here, the receiver's rules
on deliveries written as Alertmanager writes them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from common.clock import ManualClock
from controlplane.alerts.routes import AlertRoutesError, load
from controlplane.app import create_app
from controlplane.auth import service as auth_service
from controlplane.auth.roles import Role
from controlplane.config import ControlPlaneSettings
from controlplane.db import session_scope
from tests.support.answer_contract import AnswerContract

ROUTES = """
[source]
receiver = "lifeline"

[[route]]
alertname = "LifelineZoneUnserved"
action = "fault"
scope = "zone"

[[route]]
alertname = "LifelineDrillOverdue"
action = "drill"
drill = "weekly-kill"

[[route]]
alertname = "LifelineCanaryFailing"
action = "event"
"""


def alert(name: str, fingerprint: str, status: str = "firing", **labels: str) -> dict[str, Any]:
    return {"status": status, "labels": {"alertname": name, **labels},
            "annotations": {"summary": f"{name} in test"}, "startsAt": "2026-12-02T10:00:00.000Z",
            "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "http://prometheus/graph", "fingerprint": fingerprint}


def delivery(*alerts: dict[str, Any], receiver: str = "lifeline") -> dict[str, Any]:
    return {"version": "4", "groupKey": "{}:{}", "truncatedAlerts": 0, "status": "firing", "receiver": receiver,
            "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {}, "externalURL": "http://am",
            "alerts": list(alerts)}


@pytest.fixture
def alert_client(settings: ControlPlaneSettings, session_factory: Any, clock: ManualClock,
                 tmp_path: Path, answer_contract: AnswerContract) -> Iterator[TestClient]:
    routes = tmp_path / "alert-routes.toml"
    routes.write_text(ROUTES)
    app = create_app(settings.model_copy(update={"alert_routes_file": routes}), clock=clock)
    with answer_contract.watch(TestClient(app, raise_server_exceptions=False)) as client:
        yield client


@pytest.fixture
def alertmanager(session_factory: Any, clock: ManualClock, tokens: dict[str, str]) -> dict[str, str]:
    with session_scope(session_factory) as session:
        _, secret = auth_service.create_token(session, name="alertmanager", role=Role.ALERTMANAGER,
                                              created_by="test", clock=clock)
    return {"Authorization": f"Bearer {secret}"}


def alert_events(client: TestClient, as_role: Any) -> list[dict[str, Any]]:
    events = client.get("/api/v1/events", params={"limit": 1000}, headers=as_role("viewer")).json()
    return [e for e in events if e["kind"].startswith("alert.")]


def test_each_alert_acts_once_by_its_route_and_a_retried_delivery_changes_nothing(
        alert_client: TestClient, alertmanager: dict[str, str], as_role: Any) -> None:
    operator = as_role("operator")
    assert alert_client.post("/api/v1/regions", json={"name": "eu"}, headers=operator).status_code == 201
    for zone in ("eu-a", "eu-b"):
        assert alert_client.post("/api/v1/regions/eu/zones", json={"name": zone}, headers=operator).status_code == 201
        cluster = {"name": f"c-{zone}", "region": "eu", "zone": zone, "model": "tiny", "weight": 100}
        assert alert_client.post("/api/v1/clusters", json=cluster, headers=operator).status_code == 201
    drill = {"name": "weekly-kill", "model": "tiny", "scope": "instance", "fault": "sigkill",
             "blast_radius": {"region": "eu", "instances": ["e1"]}}
    assert alert_client.post("/api/v1/drills", json=drill, headers=operator).status_code == 201
    body = delivery(alert("LifelineZoneUnserved", "a1", region="eu", zone="eu-a"),
                    alert("LifelineDrillOverdue", "b2"),
                    alert("LifelineCanaryFailing", "c3", region="eu"),
                    alert("SomethingElse", "d4"),
                    alert("LifelineZoneUnserved", "e5", region="eu"),  # no zone label: its scope cannot be named
                    alert("LifelineZoneUnserved", "f6", status="resolved", region="eu", zone="eu-b"))
    answer = alert_client.post("/api/v1/alerts/alertmanager", json=body, headers=alertmanager)
    assert answer.status_code == 200, answer.json()
    results = {r["fingerprint"]: r for r in answer.json()["alerts"]}
    assert {f: (r["action"], r["outcome"]) for f, r in results.items()} == {
        "a1": ("fault", "escalated"), "b2": ("drill", "drill_requested"), "c3": ("event", "recorded"),
        "d4": ("event", "unrouted"), "e5": ("fault", "failed"), "f6": ("event", "recorded")}
    assert results["a1"]["detail"]["fault_id"] == "alert:a1@2026-12-02T10:00:00+00:00"
    assert results["a1"]["detail"]["decisions"], "the ladder decided something for the zone fault"
    # the agent's ladder, acting: the zone's cluster drained at l7 (anycast and mesh had nothing to change)
    assert alert_client.get("/api/v1/clusters/c-eu-a", headers=as_role("viewer")).json()["state"] == "draining"
    assert alert_client.get("/api/v1/clusters/c-eu-b", headers=as_role("viewer")).json()["state"] == "active"
    cutovers = alert_client.get("/api/v1/cutovers", headers=as_role("viewer")).json()
    assert len(cutovers) == 1 and cutovers[0]["mode"] == "automatic"
    assert "label(s) ['zone']" in results["e5"]["detail"]["reason"]
    run = alert_client.get(f"/api/v1/drills/runs/{results['b2']['detail']['run']}", headers=as_role("viewer")).json()
    assert (run["trigger"], run["state"]) == ("alert", "scheduled")

    events = alert_events(alert_client, as_role)
    assert sorted(e["kind"] for e in events) == ["alert.received"] * 5 + ["alert.resolved"]
    zone = next(e for e in events if e["after"]["fingerprint"] == "a1")
    assert (zone["scope"], zone["reason"], zone["routing_tier"]) == (
        "region:eu/zone:eu-a", "LifelineZoneUnserved firing: LifelineZoneUnserved in test", None)
    assert zone["actor"].startswith("token:alertmanager")

    again = alert_client.post("/api/v1/alerts/alertmanager", json=body, headers=alertmanager)
    assert {r["outcome"] for r in again.json()["alerts"]} == {"duplicate"}
    assert len(alert_events(alert_client, as_role)) == len(events)
    runs = alert_client.get("/api/v1/drills/runs", params={"name": "weekly-kill"}, headers=as_role("viewer")).json()
    assert len(runs) == 1
    assert len(alert_client.get("/api/v1/cutovers", headers=as_role("viewer")).json()) == 1


def test_an_unknown_source_another_role_or_no_routes_file_is_refused_and_changes_nothing(
        alert_client: TestClient, alertmanager: dict[str, str], as_role: Any, settings: ControlPlaneSettings,
        clock: ManualClock, answer_contract: AnswerContract) -> None:
    body = delivery(alert("LifelineCanaryFailing", "aa"), receiver="someone-else")
    refused = alert_client.post("/api/v1/alerts/alertmanager", json=body, headers=alertmanager)
    assert (refused.status_code, refused.json()["error"]["type"]) == (403, "unknown_alert_source")
    operator = alert_client.post("/api/v1/alerts/alertmanager", json=delivery(alert("X", "ab")),
                                 headers=as_role("operator"))
    assert (operator.status_code, operator.json()["error"]["type"]) == (403, "forbidden")
    malformed = alert_client.post("/api/v1/alerts/alertmanager", json={"version": "4", "alerts": []},
                                  headers=alertmanager)
    assert malformed.status_code == 422
    assert alert_events(alert_client, as_role) == []
    with answer_contract.watch(TestClient(create_app(settings, clock=clock), raise_server_exceptions=False)) as plain:
        unset = plain.post("/api/v1/alerts/alertmanager", json=delivery(alert("X", "ac")), headers=alertmanager)
        assert (unset.status_code, unset.json()["error"]["type"]) == (404, "alerts_not_configured")


@pytest.mark.parametrize(("text", "says"), [
    ("[[route]]\nalertname = 'A'\naction = 'event'\n", "source: Field required"),
    ("[source]\nreceiver = 'r'\n[[route]]\nalertname = 'A'\naction = 'fault'\n", "route.0"),
    ("[source]\nreceiver = 'r'\n[[route]]\nalertname = 'A'\naction = 'page'\n", "route.0.action"),
    ("[source]\nreceiver = 'r'\nextra = 1\n", "source.extra"),
    ("[source\n", "alert-routes.toml"),
])
def test_a_bad_routes_file_names_its_key(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "alert-routes.toml"
    path.write_text(text)
    with pytest.raises(AlertRoutesError, match=says.replace("[", r"\[").replace(".", r"\.")):
        load(path)
