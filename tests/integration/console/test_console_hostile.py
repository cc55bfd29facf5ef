"""The console under a hostile user: every action refused with a typed page, and nothing changed.

Each action route is found from the app itself (every POST under /console),
so a route added later without the guard fails here: anonymous (401
`unauthenticated`), a viewer with a valid CSRF token (403 `forbidden`), an
operator with a forged, missing or non-ASCII CSRF token (403 `csrf_failed`),
an expired session (401). Malformed fields, huge forms and odd cookies or
headers get 4xx with a stable `type`, never a 500, and the world (events,
cutovers, steps, shifts, drills, alias moves) is the same after as before.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from common.clock import ManualClock
from controlplane.auth.models import AuditRecord
from controlplane.console import events as console_events
from controlplane.console.web import MAX_FORM_BYTES
from controlplane.db import session_scope
from controlplane.drill.models import DrillDefinition, DrillRun
from controlplane.event.models import Event
from cutover.models import Cutover, CutoverGate, CutoverStep, ZonalShift
from tests.integration.console.conftest import csrf_of, sign_in
from tests.integration.console.test_console_pages import register
from tests.support.controlplane_testing import ON_SQLITE
from weight_catalog import aliases as catalog_aliases
from weight_catalog.models import AliasMove

pytestmark = [ON_SQLITE, pytest.mark.usefixtures("topology_eu")]

ZONE_DRILL = {"name": "lose-eu-a", "model": "m", "scope": "zone", "fault": "zone_loss",
              "blast_radius": {"region": "eu", "zones": ["eu-a"]}}
# Every field any action form reads, each valid on its own: only the guard under test may refuse.
FULL_FORM = {"alias": "prod", "version": "v2", "reason": "hostile", "scope_kind": "zone", "region": "eu",
             "name": "eu-a", "tier": "l7", "target_state": "out", "idempotency_key": "k-1", "zone": "eu-b",
             "expires_in_h": "1", "spec": json.dumps({**ZONE_DRILL, "name": "hostile-drill"})}
PATH_VALUES = {"model": "tiny", "alias": "prod", "name": "lose-eu-a"}  # any other parameter is an id: 1


def _routes(routes: list[Any]) -> list[APIRoute]:
    """Every APIRoute, through included routers (FastAPI 0.165 keeps each as a lazy `_IncludedRouter`)."""
    found: list[APIRoute] = []
    for route in routes:
        if isinstance(route, APIRoute):
            found.append(route)
        elif hasattr(route, "original_router"):
            found.extend(_routes(route.original_router.routes))
        elif hasattr(route, "routes"):
            found.extend(_routes(route.routes))
    return found


def action_paths(app: Any) -> list[tuple[str, str]]:
    """(route name, concrete path) of every console POST but sign-in and sign-out."""
    found = []
    for route in _routes(app.router.routes):
        if route.path.startswith("/console") and "POST" in route.methods \
                and route.name not in ("console.sign_in", "console.sign_out"):
            found.append((route.name, re.sub(r"\{(\w+)\}", lambda m: PATH_VALUES.get(m.group(1), "1"), route.path)))
    return sorted(found)


def world(session_factory: Any) -> dict[str, Any]:
    """What an action could change: row counts, the state of every cutover, shift and drill run, the stop switch."""
    with session_factory() as session:
        counts = {model.__name__: session.query(model).count()
                  for model in (Event, Cutover, CutoverStep, ZonalShift, DrillDefinition, DrillRun, AliasMove)}
        return {**counts,
                "cutovers": sorted((c.id, c.state, c.revision) for c in session.query(Cutover)),
                "shifts": sorted((s.id, s.ended_at is None) for s in session.query(ZonalShift)),
                "runs": sorted((r.id, r.state, r.approved_by) for r in session.query(DrillRun)),
                "gate": [(g.stopped, g.revision) for g in session.query(CutoverGate)],
                "aliases": catalog_aliases.get_alias_or_raise(session, model="tiny", name="prod").revision}


def last_audit(session_factory: Any) -> tuple[str, str, int | None]:
    with session_factory() as session:
        row = session.query(AuditRecord).order_by(AuditRecord.id.desc()).first()
        return row.action, row.outcome, row.status_code


def error_type(response: Any) -> str:
    found = re.search(r'data-testid="error-type">([a-z_]+)<', response.text)
    assert found, f"{response.status_code}: not a typed refusal page: {response.text[:300]}"
    return found.group(1)


@pytest.fixture
def targets(topology_eu: None, console: TestClient, tokens: dict[str, str], session_factory: Any,
            clock: ManualClock, tmp_path: Path) -> None:
    """Something for every action to hit: alias prod (v1, v2 registered), a planned cutover #1, an active
    zonal shift #1 (its cutover #2 completed), a zone drill with run #1 awaiting approval."""
    register(session_factory, clock, tmp_path / "artifacts", "v1")
    register(session_factory, clock, tmp_path / "artifacts", "v2")
    with session_scope(session_factory) as session:
        catalog_aliases.promote(session, model="tiny", alias="prod", version="v1", actor="test", reason="first",
                                clock=clock)
    csrf = sign_in(console, tokens["operator"])
    planned = console.post("/console/cutovers", data={**FULL_FORM, "csrf_token": csrf}, follow_redirects=False)
    assert planned.headers.get("location") == "/console/cutovers/1", planned.text[planned.text.find("error-type"):][:400]
    shifted = console.post("/console/zonal-shifts", data={**FULL_FORM, "csrf_token": csrf}, follow_redirects=False)
    assert shifted.headers.get("location") == "/console/cutovers/2", shifted.text[shifted.text.find("error-type"):][:400]
    headers = {"Authorization": f"Bearer {tokens['operator']}"}
    assert console.post("/api/v1/drills", json=ZONE_DRILL, headers=headers).status_code == 201
    assert console.post("/api/v1/drills/lose-eu-a/runs", headers=headers).json()["id"] == 1
    console.cookies.clear()


@pytest.mark.usefixtures("targets")
def test_every_action_refuses_anonymous_viewer_and_bad_csrf_and_changes_nothing(
    console: TestClient, tokens: dict[str, str], session_factory: Any,
) -> None:
    actions = action_paths(console.app)
    assert len(actions) >= 13, actions  # promote, roll back, plan, execute, roll back, abort, gate, shift ×2, drill ×4
    before = world(session_factory)

    def refused(name: str, path: str, form: dict[str, str], status: int, kind: str) -> None:
        response = console.post(path, data=form, follow_redirects=False)
        assert (response.status_code, error_type(response)) == (status, kind), (name, path)
        assert last_audit(session_factory) == (name, "failed", status), (name, path)

    for name, path in actions:
        refused(name, path, {**FULL_FORM, "csrf_token": "0" * 64}, 401, "unauthenticated")
    viewer_csrf = sign_in(console, tokens["viewer"])
    for name, path in actions:
        refused(name, path, {**FULL_FORM, "csrf_token": viewer_csrf}, 403, "forbidden")
    operator_csrf = sign_in(console, tokens["operator"])
    one_off = operator_csrf[:-1] + ("1" if operator_csrf.endswith("0") else "0")  # never the token itself
    for forged in ("", viewer_csrf, one_off, "é" * 64, operator_csrf + "\u00a0"):
        for name, path in actions:
            refused(name, path, {**FULL_FORM, "csrf_token": forged}, 403, "csrf_failed")
    for name, path in actions:
        form = {k: v for k, v in FULL_FORM.items()}  # no csrf_token at all
        refused(name, path, form, 403, "csrf_failed")
    assert world(session_factory) == before

    # The same form with the operator's own token does act: the world above could have changed.
    done = console.post("/console/cutovers", data={**FULL_FORM, "csrf_token": operator_csrf},
                        follow_redirects=False)
    assert done.status_code == 303 and world(session_factory) != before


@pytest.mark.usefixtures("targets")
def test_an_expired_session_is_refused_at_every_action(console: TestClient, tokens: dict[str, str],
                                                       session_factory: Any, clock: ManualClock) -> None:
    csrf = sign_in(console, tokens["operator"])
    before = world(session_factory)
    clock.t += 8 * 3600 + 1
    for name, path in action_paths(console.app):
        response = console.post(path, data={**FULL_FORM, "csrf_token": csrf})
        assert (response.status_code, error_type(response)) == (401, "unauthenticated"), name
        assert "Sign in" in response.text
    assert world(session_factory) == before


@pytest.mark.usefixtures("targets")
def test_a_huge_form_is_refused_as_too_large_before_anything_else(console: TestClient, tokens: dict[str, str],
                                                                  session_factory: Any) -> None:
    csrf = sign_in(console, tokens["operator"])
    before = world(session_factory)
    huge = "x" * (MAX_FORM_BYTES + 1)
    for name, path in action_paths(console.app):
        response = console.post(path, data={**FULL_FORM, "csrf_token": csrf, "reason": huge})
        assert (response.status_code, error_type(response)) == (413, "request_too_large"), name
    # Chunked (no Content-Length): counted as it arrives and refused the same way.
    chunks = (part for part in (f"csrf_token={csrf}&reason=".encode(), huge.encode()))
    chunked = console.post("/console/cutovers", content=chunks,
                           headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert (chunked.status_code, error_type(chunked)) == (413, "request_too_large")
    console.cookies.clear()
    form = console.get("/console/sign-in").text
    signin_csrf = form.split('name="signin_csrf" value="')[1].split('"')[0]
    signin = console.post("/console/sign-in", data={"signin_csrf": signin_csrf, "token": huge})
    assert (signin.status_code, error_type(signin)) == (413, "request_too_large")
    assert "lifeline_console" not in console.cookies
    assert world(session_factory) == before


PLAN = {"scope_kind": "zone", "region": "eu", "name": "eu-a", "tier": "l7", "target_state": "out", "reason": "r"}
SHIFT = {"region": "eu", "zone": "eu-b", "expires_in_h": "1", "reason": "r"}


@pytest.mark.parametrize(("path", "form", "status", "kind"), [
    ("/console/cutovers", {**PLAN, "scope_kind": "galaxy"}, 422, "invalid_request"),
    ("/console/cutovers", {**PLAN, "tier": "carrier-pigeon"}, 422, "invalid_request"),
    ("/console/cutovers", {**PLAN, "target_state": "sideways"}, 422, "invalid_request"),
    ("/console/cutovers", {**PLAN, "scope_kind": "instance", "generation": "abc"}, 422, "invalid_request"),
    ("/console/cutovers", {**PLAN, "scope_kind": "instance", "generation": "9" * 30}, 422, "invalid_request"),
    ("/console/cutovers", {**PLAN, "reason": ""}, 422, "invalid_request"),
    ("/console/cutovers", {**PLAN, "region": "atlantis"}, 404, "region_not_found"),
    ("/console/zonal-shifts", {**SHIFT, "expires_in_h": "soon"}, 422, "invalid_request"),
    ("/console/zonal-shifts", {**SHIFT, "expires_in_h": "nan"}, 422, "invalid_request"),
    ("/console/zonal-shifts", {**SHIFT, "expires_in_h": "inf"}, 422, "invalid_request"),
    ("/console/zonal-shifts", {**SHIFT, "expires_in_h": "1e300"}, 422, "invalid_request"),
    ("/console/zonal-shifts", {**SHIFT, "expires_in_h": "-1"}, 422, "invalid_expiry"),
    ("/console/cutovers/1/execute", {"idempotency_key": ""}, 422, "invalid_request"),
    ("/console/cutovers/1/rollback", {"reason": "r"}, 409, "invalid_transition"),
    ("/console/cutovers/1/abort", {"reason": "r"}, 409, "invalid_transition"),  # #1 is planned, not running
    ("/console/cutovers/1/abort", {"reason": "\x00\x00"}, 422, "invalid_request"),
    ("/console/cutover-gate", {"stopped": "maybe", "reason": "r"}, 422, "invalid_request"),
    ("/console/cutover-gate", {"stopped": "on", "reason": "r", "expected_revision": "9" * 30}, 422, "invalid_request"),
    ("/console/cutover-gate", {"stopped": "on", "reason": "r", "expected_revision": "5"}, 409, "gate_conflict"),
    ("/console/cutover-gate", {"stopped": "off", "reason": "r"}, 403, "forbidden"),  # releasing needs an admin
    ("/console/catalog/tiny/promote", {"alias": "../etc", "version": "v2", "reason": "r"}, 422, "invalid_request"),
    ("/console/catalog/tiny/promote", {"alias": "prod", "version": "v9", "reason": "r"}, 404, "version_not_found"),
    ("/console/drills", {"spec": "[1, 2"}, 422, "invalid_request"),
    ("/console/drills", {"spec": '"a string"'}, 422, "invalid_request"),
    ("/console/drills", {"spec": "[" * 5000 + "]" * 5000}, 422, "invalid_request"),  # RecursionError in json
    ("/console/drills", {"spec": json.dumps({**ZONE_DRILL, "name": "x" * 5000})}, 422, "invalid_request"),
    ("/console/drills/runs/1/abort", {"reason": "\x00\x00"}, 422, "invalid_request"),
    ("/console/drills/lose-eu-a/runs", {"version": "9" * 30}, 422, "invalid_request"),
    ("/console/drills/lose-eu-a/runs", {"version": "0"}, 422, "invalid_request"),
])
@pytest.mark.usefixtures("targets")
def test_a_malformed_field_gets_a_typed_refusal_and_changes_nothing(
    console: TestClient, tokens: dict[str, str], session_factory: Any, path: str, form: dict[str, str],
    status: int, kind: str,
) -> None:
    csrf = sign_in(console, tokens["operator"])
    before = world(session_factory)
    response = console.post(path, data={**form, "csrf_token": csrf})
    assert (response.status_code, error_type(response)) == (status, kind), response.text[-600:]
    assert world(session_factory) == before


@pytest.mark.usefixtures("targets")
def test_script_in_a_field_is_shown_as_text(console: TestClient, tokens: dict[str, str]) -> None:
    csrf = sign_in(console, tokens["operator"])
    script = "<script>alert(1)</script>"
    planned = console.post("/console/cutovers", data={**PLAN, "csrf_token": csrf, "reason": script})
    assert planned.status_code == 200 and script not in planned.text and "&lt;script&gt;" in planned.text
    refused = console.post("/console/cutovers", data={**PLAN, "csrf_token": csrf, "region": script})
    assert refused.status_code in (404, 422) and script not in refused.text


def test_odd_cookies_and_headers_are_refused_not_crashed(console: TestClient, tokens: dict[str, str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    for cookie in ("²." * 3 + "x", "1.²²².n.m", "9" * 40 + ".1.n.m", "1." + "9" * 40 + ".n.m", "....", "1.2.é.ü"):
        raw = f"lifeline_console={cookie}".encode()  # raw bytes: httpx's cookie jar would refuse non-ASCII
        response = console.get("/console/fleet", headers={"Cookie": raw}, follow_redirects=False)
        assert response.status_code == 303 and "/console/sign-in" in response.headers["location"], cookie
    form = console.get("/console/sign-in").text
    non_ascii = console.post("/console/sign-in", data={"signin_csrf": "é" * 8, "token": tokens["admin"]})
    assert (non_ascii.status_code, error_type(non_ascii)) == (403, "csrf_failed")
    assert "lifeline_console" not in console.cookies and "signin_csrf" in form

    # The event stream resumes from Last-Event-ID; one that is not a plain number is ignored, one past
    # the id range is clamped. A stream of a single poll, so the test reads it to its end.
    monkeypatch.setattr(console_events, "sse_frames", functools.partial(console_events.sse_frames, polls=1))
    sign_in(console, tokens["viewer"])
    for last_event_id in ("²", "١٢", "9" * 20, "-1"):
        stream = console.get("/console/events/stream", headers={"Last-Event-ID": last_event_id.encode()})
        assert stream.status_code == 200 and stream.text.startswith("retry:"), (last_event_id, stream.text[:200])
    too_far = console.get("/console/events/stream", params={"after_id": str(2**63)})
    assert too_far.status_code == 422
    # A drill version past the id range is refused by the query's bounds, not by the database (a 500).
    confirm = console.get("/console/drills/lose-eu-a/request", params={"version": "9" * 30})
    assert confirm.status_code == 422


@pytest.mark.usefixtures("targets")
def test_an_unknown_filter_value_is_refused_not_ignored(console: TestClient, tokens: dict[str, str]) -> None:
    sign_in(console, tokens["viewer"])
    page = console.get("/console/events", params={"routing_tier": "carrier-pigeon"})
    assert (page.status_code, error_type(page)) == (422, "invalid_request")
    assert "carrier-pigeon" in page.text and "l7" in page.text  # it names the value and what is allowed
    assert console.get("/console/events", params={"routing_tier": "l7"}).status_code == 200
    csrf_of(console.get("/console/events").text)


@pytest.mark.parametrize("path", ["/console/cutovers/99999999999999999999", "/console/drills/runs/-1",
                                  "/console/zonal-shifts/1x/cancel", "/console/no-such-page"])
def test_a_path_the_router_refuses_is_a_typed_page_not_json(console: TestClient, tokens: dict[str, str],
                                                            path: str) -> None:
    sign_in(console, tokens["viewer"])
    response = console.get(path)
    assert response.status_code in (404, 422), response.text[:300]
    assert response.headers["content-type"].startswith("text/html")
    assert error_type(response) == ("not_found" if response.status_code == 404 else "invalid_request")
    assert response.headers["content-security-policy"].startswith("default-src 'none'")


def test_the_api_keeps_its_json_errors(console: TestClient, tokens: dict[str, str]) -> None:
    response = console.get("/api/v1/cutovers/99999999999999999999",
                           headers={"Authorization": f"Bearer {tokens['viewer']}"})
    assert response.status_code == 422 and response.json()["error"]["type"] == "invalid_request"
