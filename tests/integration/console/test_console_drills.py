"""Drills and SLOs in the console: runs, approvals (operator; a viewer is refused), SLO documents."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from controlplane.drill import service as drill_service
from tests.integration.console.conftest import sign_in
from tests.support.controlplane_testing import ON_SQLITE

pytestmark = [pytest.mark.integration, ON_SQLITE, pytest.mark.usefixtures("topology_eu")]

ZONE_DRILL = {"name": "lose-eu-a", "model": "m", "scope": "zone", "fault": "zone_loss",
              "blast_radius": {"region": "eu", "zones": ["eu-a"]}}


@pytest.fixture
def awaiting_run(console: TestClient, tokens: dict[str, str]) -> int:
    headers = {"Authorization": f"Bearer {tokens['operator']}"}
    assert console.post("/api/v1/drills", json=ZONE_DRILL, headers=headers).status_code == 201
    run = console.post("/api/v1/drills/lose-eu-a/runs", headers=headers)
    assert run.status_code == 201 and run.json()["state"] == "awaiting_approval"
    return int(run.json()["id"])


def test_viewer_sees_a_run_awaiting_approval_and_cannot_approve(console: TestClient, tokens: dict[str, str],
                                                                 awaiting_run: int, session_factory: Any) -> None:
    csrf = sign_in(console, tokens["viewer"])
    listing = console.get("/console/drills").text
    assert f'data-testid="drill-run-{awaiting_run}"' in listing and "needs approval" in listing
    detail = console.get(f"/console/drills/runs/{awaiting_run}").text
    assert "awaiting_approval" in detail and "Approve drill run" not in detail and "No report yet" in detail
    refused = console.post(f"/console/drills/runs/{awaiting_run}/approve", data={"csrf_token": csrf})
    assert refused.status_code == 403
    with session_factory() as session:
        assert drill_service.get_run_or_raise(session, run_id=awaiting_run).approved_by is None
    assert console.get(f"/console/drills/runs/{awaiting_run}/timeline.png").status_code == 404


def test_operator_approves_through_the_drill_service(console: TestClient, tokens: dict[str, str],
                                                     awaiting_run: int, session_factory: Any) -> None:
    csrf = sign_in(console, tokens["operator"])
    detail = console.get(f"/console/drills/runs/{awaiting_run}").text
    assert "Approve drill run" in detail and "zone_loss" in detail
    assert console.post(f"/console/drills/runs/{awaiting_run}/approve", data={}).status_code == 403  # no CSRF
    approved = console.post(f"/console/drills/runs/{awaiting_run}/approve", data={"csrf_token": csrf})
    assert approved.status_code == 200, approved.text
    with session_factory() as session:
        run = drill_service.get_run_or_raise(session, run_id=awaiting_run)
    assert run.approved_by == "token:test-operator#2" and run.state == "scheduled"
    events = console.get("/console/events", params={"kind": "drill.approved"}).text
    assert f'href="/console/drills/runs/{awaiting_run}"' in events  # one click from the event to its run
    again = console.post(f"/console/drills/runs/{awaiting_run}/approve", data={"csrf_token": csrf})
    assert again.status_code == 409  # the drill service's own refusal, rendered with its status


def test_slo_document_marks_figures_without_a_run_unverified(console: TestClient, tokens: dict[str, str],
                                                             awaiting_run: int) -> None:
    sign_in(console, tokens["viewer"])
    page = console.get("/console/slo/m")
    assert page.status_code == 200
    assert "unverified" in page.text and "verified</span>" not in page.text.replace("unverified</span>", "")


REPORT = {
    "drill": "lose-eu-a", "version": 1, "run": 0, "model": "m", "scope": "zone", "fault": "zone_loss",
    "fault_target": "eu-a", "region": "eu", "blast_radius": {"instances": [], "max_instances": 1},
    "requests": 2, "migrated_streams": 1, "error_rate": 0.0, "passed": True,
    "verdicts": [{"metric": "request_rto_s", "target": 2.0, "measured": 0.8, "met": True}],
    "events": [], "follow_ups": [],
    "timeline": [{"index": 0, "start": -0.5, "end": 1.2, "tokens": [-0.4, 0.1, 0.9], "epochs": [0, 1, 1],
                  "error": None}],
    "event_offsets": [[0.3, "cutover.step"]],
}


def test_a_runs_report_and_its_timeline_plot(console: TestClient, tokens: dict[str, str], awaiting_run: int,
                                             session_factory: Any) -> None:
    from controlplane.db import session_scope
    from controlplane.drill.models import DrillRun

    with session_scope(session_factory) as session:
        session.get(DrillRun, awaiting_run).report = {**REPORT, "run": awaiting_run}  # as the runner stores it
    sign_in(console, tokens["viewer"])
    page = console.get(f"/console/drills/runs/{awaiting_run}").text
    assert "RTO measured vs target" in page and "| request_rto_s | 2.000 | 0.800 | yes |" in page
    assert f'src="/console/drills/runs/{awaiting_run}/timeline.png"' in page
    plot = console.get(f"/console/drills/runs/{awaiting_run}/timeline.png")
    assert plot.status_code == 200 and plot.headers["content-type"] == "image/png"
    assert plot.content.startswith(b"\x89PNG\r\n\x1a\n")
