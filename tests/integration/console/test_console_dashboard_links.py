"""With a Grafana configured, a cutover's and a drill run's pages link to their dashboard panels over their window."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from fastapi.testclient import TestClient

from common.clock import ManualClock
from controlplane.app import create_app
from controlplane.config import ControlPlaneSettings
from controlplane.console.dashboards import MARGIN
from controlplane.db import session_scope
from controlplane.drill import service as drills
from controlplane.drill.schemas import DrillSpec
from tests.integration.console.conftest import sign_in
from tests.support.answer_contract import AnswerContract

GRAFANA = "https://grafana.example"
LINK = re.compile(r'href="(https://grafana\.example/d/[^"]+)" data-testid="dashboard-link"')


@pytest.fixture
def with_grafana(settings: ControlPlaneSettings, session_factory: Any, clock: ManualClock,
                 tokens: dict[str, str], answer_contract: AnswerContract) -> Iterator[TestClient]:
    app = create_app(settings.model_copy(update={"grafana_url": GRAFANA}), clock=clock)
    with answer_contract.watch(TestClient(app, raise_server_exceptions=False, base_url="http://testserver")) as client:
        sign_in(client, tokens["viewer"])
        yield client


def query(link: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlparse(link.replace("&amp;", "&")).query).items()}


def test_a_cutover_links_to_the_ladders_decisions_over_its_window(
        with_grafana: TestClient, tokens: dict[str, str], topology_eu: None, clock: ManualClock) -> None:
    planned = with_grafana.post("/api/v1/cutovers", headers={"Authorization": f"Bearer {tokens['operator']}"}, json={
        "scope": {"kind": "zone", "region": "eu", "name": "eu-a"}, "tier": "l7", "reason": "test"})
    assert planned.status_code == 201, planned.text
    cutover = planned.json()
    page = with_grafana.get(f"/console/cutovers/{cutover['id']}").text
    [link] = LINK.findall(page)
    assert link.startswith(f"{GRAFANA}/d/lifeline-cutovers?")
    asked = query(link)
    assert asked["viewPanel"] == "1" and asked["to"] == "now"  # not ended: up to now
    assert int(asked["from"]) == int((clock.utcnow() - MARGIN).timestamp() * 1000)


def test_a_drill_run_links_to_the_recovery_gap_while_it_ran(
        with_grafana: TestClient, session_factory: Any, clock: ManualClock) -> None:
    spec = DrillSpec.model_validate({"name": "weekly-kill", "model": "tiny", "scope": "instance", "fault": "sigkill",
                                     "blast_radius": {"region": "eu", "instances": ["e1"]}})
    with session_scope(session_factory) as session:
        run = drills.create_run(session, definition=drills.define(session, spec=spec, actor="t", clock=clock),
                                trigger="manual", actor="t", clock=clock)
        run_id = run.id
    assert not LINK.findall(with_grafana.get(f"/console/drills/runs/{run_id}").text)  # never started: no window
    with session_scope(session_factory) as session:
        drills.start(session, run_id=run_id, fault_target="e1", actor="t", clock=clock)
    [link] = LINK.findall(with_grafana.get(f"/console/drills/runs/{run_id}").text)
    assert link.startswith(f"{GRAFANA}/d/lifeline-streams?") and query(link)["viewPanel"] == "3"


def test_without_a_grafana_there_are_no_dashboard_links(
        console: TestClient, signed_in: Any, tokens: dict[str, str], topology_eu: None) -> None:
    signed_in("viewer")
    planned = console.post("/api/v1/cutovers", headers={"Authorization": f"Bearer {tokens['operator']}"}, json={
        "scope": {"kind": "zone", "region": "eu", "name": "eu-a"}, "tier": "l7", "reason": "test"})
    cutover = planned.json()
    assert "dashboard-link" not in console.get(f"/console/cutovers/{cutover['id']}").text


def test_an_alert_event_links_to_the_query_that_fired_and_never_to_a_script() -> None:
    from controlplane.console.events import link_for
    from controlplane.event.models import Event

    def alert_event(url: str) -> Event:
        return Event(kind="alert.received", actor="token:alertmanager", reason="r", scope="alerts",
                     after={"generator_url": url}, outcome="succeeded")

    assert link_for(alert_event("http://prometheus:9090/graph?g0.expr=up")) == (
        "http://prometheus:9090/graph?g0.expr=up", "the alert's query")
    assert link_for(alert_event("javascript:alert(1)")) is None
