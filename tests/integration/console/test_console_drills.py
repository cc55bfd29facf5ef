"""Drills and SLOs in the console: runs, approvals (operator; a viewer is refused), SLO documents."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from controlplane.drill import service as drill_service
from tests.integration.console.conftest import sign_in
from tests.support.controlplane_testing import ON_SQLITE

pytestmark = [ON_SQLITE, pytest.mark.usefixtures("topology_eu")]

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
    # The generated continuation promise and the policies' RPO_context, as in the exported document.
    assert 'data-testid="slo-continuation"' in page.text and "not recorded by any drill run" in page.text
    assert "No replication policy" in page.text


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


def _audit(session_factory: Any) -> list[tuple[str, str, int | None]]:
    from controlplane.auth.models import AuditRecord

    with session_factory() as session:
        return [(r.action, r.outcome, r.status_code) for r in session.query(AuditRecord).order_by(AuditRecord.id)
                if r.action.startswith("console.drill")]


def _definitions(session_factory: Any) -> list[tuple[str, int]]:
    from controlplane.drill import repository

    with session_factory() as session:
        return [(d.name, d.version) for d in repository.list_definitions(session, latest_only=False)]


def test_a_viewer_sees_no_drill_action_and_every_one_is_refused_anyway(
    console: TestClient, tokens: dict[str, str], awaiting_run: int, session_factory: Any
) -> None:
    csrf = sign_in(console, tokens["viewer"])
    pages = [console.get(path).text for path in (
        "/console/drills", "/console/drills/lose-eu-a/request", f"/console/drills/runs/{awaiting_run}",
        f"/console/drills/runs/{awaiting_run}/abort")]
    for html in pages:
        assert "<form method=\"post\"" not in html.replace('<form method="post" action="/console/sign-out"', "")
    assert "Request a run" not in pages[0] and "Define a drill" not in pages[0]
    assert "Review abort" not in pages[2]
    import json

    refusals = [
        console.post("/console/drills", data={"csrf_token": csrf, "spec": json.dumps({**ZONE_DRILL, "name": "x"})}),
        console.post("/console/drills/lose-eu-a/runs", data={"csrf_token": csrf}),
        console.post(f"/console/drills/runs/{awaiting_run}/abort", data={"csrf_token": csrf, "reason": "no"}),
    ]
    assert [r.status_code for r in refusals] == [403, 403, 403]
    assert all("forbidden" in r.text for r in refusals)
    assert _definitions(session_factory) == [("lose-eu-a", 1)]
    with session_factory() as session:
        assert len(drill_service.list_runs(session)) == 1
        assert drill_service.get_run_or_raise(session, run_id=awaiting_run).state == "awaiting_approval"
    assert [a[1:] for a in _audit(session_factory)] == [("failed", 403)] * 3  # refused, and recorded


def test_an_operator_defines_a_drill_from_json_and_bad_input_changes_nothing(
    console: TestClient, tokens: dict[str, str], session_factory: Any
) -> None:
    import json

    csrf = sign_in(console, tokens["operator"])
    page = console.get("/console/drills").text
    assert "Define a drill" in page and "kill-one-engine" in page  # the form comes with an example to edit
    for spec, why in (("{not json", "not JSON"), ("[1, 2]", "JSON object"),
                      (json.dumps({**ZONE_DRILL, "fault": "sigkill"}), "not a zone fault"),
                      (json.dumps({**ZONE_DRILL, "surprise": 1}), "surprise")):
        refused = console.post("/console/drills", data={"csrf_token": csrf, "spec": spec})
        assert refused.status_code == 422 and "invalid_request" in refused.text and why in refused.text, spec
    assert console.post("/console/drills", data={"spec": json.dumps(ZONE_DRILL)}).status_code == 403  # no CSRF
    assert _definitions(session_factory) == []

    defined = console.post("/console/drills", data={"csrf_token": csrf, "spec": json.dumps(ZONE_DRILL)},
                           follow_redirects=False)
    assert defined.status_code == 303 and defined.headers["location"] == "/console/drills#drill-lose-eu-a"
    again = console.post("/console/drills", data={"csrf_token": csrf, "spec": json.dumps(
        {**ZONE_DRILL, "description": "second version"})})
    assert again.status_code == 200
    assert _definitions(session_factory) == [("lose-eu-a", 1), ("lose-eu-a", 2)]
    assert 'data-testid="drill-lose-eu-a"' in again.text and "lose-eu-a v2" in again.text
    with session_factory() as session:
        from controlplane.drill import repository

        [latest] = repository.list_definitions(session)
        assert latest.created_by == "token:test-operator#2"  # the session's token, as a bearer call records
    assert [a[1] for a in _audit(session_factory)].count("succeeded") == 2


def test_an_operator_requests_a_run_behind_a_confirmation_and_aborts_it_behind_another(
    console: TestClient, tokens: dict[str, str], session_factory: Any
) -> None:
    headers = {"Authorization": f"Bearer {tokens['operator']}"}
    assert console.post("/api/v1/drills", json=ZONE_DRILL, headers=headers).status_code == 201
    csrf = sign_in(console, tokens["operator"])
    listing = console.get("/console/drills").text
    assert 'href="/console/drills/lose-eu-a/request?version=1"' in listing
    confirm = console.get("/console/drills/lose-eu-a/request", params={"version": 1}).text
    spec = confirm.split('data-testid="drill-spec"')[1].split("</pre>")[0]
    assert "zone_loss" in confirm and "awaiting approval" in confirm and "zones&#34;: [" in spec and "eu-a" in spec
    assert 'name="version" value="1"' in confirm
    assert console.get("/console/drills/nope/request").status_code == 404  # drill_not_found, as the API says

    assert console.post("/console/drills/lose-eu-a/runs", data={"version": "1"}).status_code == 403  # no CSRF
    requested = console.post("/console/drills/lose-eu-a/runs", data={"csrf_token": csrf, "version": "1"},
                             follow_redirects=False)
    assert requested.status_code == 303
    run_id = int(requested.headers["location"].rsplit("/", 1)[1])
    with session_factory() as session:
        run = drill_service.get_run_or_raise(session, run_id=run_id)
        assert (run.state, run.requested_by, run.trigger) == ("awaiting_approval", "token:test-operator#2", "manual")
    assert console.post("/console/drills/lose-eu-a/runs", data={"csrf_token": csrf, "version": "9"}).status_code == 404

    detail = console.get(f"/console/drills/runs/{run_id}").text
    assert f'href="/console/drills/runs/{run_id}/abort"' in detail
    review = console.get(f"/console/drills/runs/{run_id}/abort").text
    assert "never injects its fault" in review and f"Abort drill run #{run_id}" in review
    blank = console.post(f"/console/drills/runs/{run_id}/abort", data={"csrf_token": csrf, "reason": "  "})
    assert blank.status_code == 422 and "invalid_request" in blank.text
    with session_factory() as session:
        assert drill_service.get_run_or_raise(session, run_id=run_id).state == "awaiting_approval"
    aborted = console.post(f"/console/drills/runs/{run_id}/abort",
                           data={"csrf_token": csrf, "reason": "not during the launch"})
    assert aborted.status_code == 200 and "aborted" in aborted.text and "not during the launch" in aborted.text
    with session_factory() as session:
        run = drill_service.get_run_or_raise(session, run_id=run_id)
        assert (run.state, run.abort_reason) == ("aborted", "not during the launch")
    assert "Review abort" not in aborted.text  # a finished run offers no abort
    again = console.post(f"/console/drills/runs/{run_id}/abort", data={"csrf_token": csrf, "reason": "twice"})
    assert again.status_code == 409 and "invalid_transition" in again.text  # the drill service's own refusal
    events = console.get("/console/events", params={"kind": "drill.aborted"}).text
    assert f'href="/console/drills/runs/{run_id}"' in events
    assert ("console.drill_abort", "succeeded", 303) in _audit(session_factory)
