"""The console's abort of a running cutover and its cutover stop switch (TestClient, SQLite).

A cutover really runs: `cutover.flows.execute` in a thread of its own on
the app's runtime, held inside its first step by a scripted tier (an
in-memory stand-in for a routing system), while the console acts on it
through the same flow and service functions as the REST routes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY

from common.clock import ManualClock
from controlplane.auth.models import AuditRecord
from controlplane.db import session_scope
from controlplane.event import service as event_service
from controlplane.event.repository import EventFilter
from cutover import flows, service as cutover_service
from cutover.drivers.snapshot_l7 import SnapshotL7Driver
from cutover.models import Cutover, CutoverMode
from cutover.scope import Scope, ScopeKind, TargetState
from contract.routing_tier import RoutingTier
from cutover.policy import CutoverPolicy
from cutover.runtime import CutoverRuntime
from tests.integration.console.conftest import csrf_of, sign_in
from tests.integration.cutover.test_cutover_support import ScriptedDriver
from tests.support.controlplane_testing import ON_SQLITE

pytestmark = [ON_SQLITE, pytest.mark.usefixtures("topology_eu")]

EU = Scope(ScopeKind.REGION, "eu", "eu")


class Running:
    """A cutover of region eu (anycast, then l7 c-eu-a and c-eu-b) whose runner is held inside step 1."""

    def __init__(self, runtime: CutoverRuntime, scripted: ScriptedDriver) -> None:
        self.runtime, self.scripted = runtime, scripted
        with session_scope(runtime.factory) as session:
            cutover, _ = cutover_service.plan(session, runtime, scope=EU, tiers=[RoutingTier.ANYCAST, RoutingTier.L7],
                                              target_state=TargetState.OUT, reason="eu degraded",
                                              mode=CutoverMode.MANUAL, actor="token:test-operator#2")
            self.id = cutover.id
        self.finished: dict[str, Cutover] = {}
        scripted.block = threading.Event()
        self.thread = threading.Thread(target=lambda: self.finished.update(done=flows.execute(
            runtime, cutover_id=self.id, idempotency_key="k", actor="token:test-operator#2")))
        self.thread.start()
        assert scripted.blocked.wait(30)

    def finish(self) -> Cutover:
        assert self.scripted.block is not None
        self.scripted.block.set()
        self.thread.join(60)
        assert not self.thread.is_alive()
        return self.finished["done"]


@pytest.fixture
def running(console: TestClient, clock: ManualClock) -> Iterator[Running]:
    state = console.app.state
    scripted = ScriptedDriver(targets={"region:eu": ["203.0.113.0/24"]})
    l7 = SnapshotL7Driver(state.session_factory, read_factory=state.read_session_factory, clock=clock,
                          sleep=clock.advance, poll_interval_s=0.1)
    state.cutover_runtime = CutoverRuntime(
        factory=state.session_factory, read_factory=state.read_session_factory, clock=clock, drivers=[l7, scripted],
        policy=CutoverPolicy(claim_ttl=timedelta(seconds=60), step_timeout=timedelta(seconds=2)))
    cutover = Running(state.cutover_runtime, scripted)
    try:
        yield cutover
    finally:
        if cutover.thread.is_alive():
            cutover.finish()


def _events(session_factory: Any, kind: str) -> list[Any]:
    with session_factory() as session:
        return sorted(event_service.list_events(session, EventFilter(kind=kind), limit=100), key=lambda e: e.id)


def _audit(session_factory: Any, action: str) -> list[tuple[str, int | None]]:
    with session_factory() as session:
        return [(r.actor, r.status_code) for r in session.query(AuditRecord).filter(AuditRecord.action == action)
                .order_by(AuditRecord.id)]


def _abort_count(outcome: str) -> float:
    """The process's abort counter (the default registry, which the control plane's /metrics serves)."""
    return REGISTRY.get_sample_value("lifeline_cutover_abort_requests_total", {"outcome": outcome}) or 0.0


def _type(response: Any) -> tuple[int, str]:
    found = response.text.split('data-testid="error-type">')
    return response.status_code, (found[1].split("<")[0] if len(found) > 1 else "")


def test_an_operator_aborts_a_running_cutover_behind_its_confirmation(
        console: TestClient, tokens: dict[str, str], session_factory: Any, running: Running) -> None:
    page = f"/console/cutovers/{running.id}"
    viewer_csrf = sign_in(console, tokens["viewer"])
    shown = console.get(page).text
    assert 'data-testid="cutover-state">executing' in shown and "review-abort" not in shown
    refused = console.post(f"{page}/abort", data={"csrf_token": viewer_csrf, "reason": "viewer"})
    assert _type(refused) == (403, "forbidden")

    csrf = sign_in(console, tokens["operator"])
    assert 'data-testid="review-abort"' in console.get(page).text
    confirm = console.get(f"{page}/abort").text
    assert "A runner holds this cutover" in confirm and "next step boundary" in confirm
    assert 'data-testid="abort-form"' in confirm and 'data-testid="step-1"' in confirm
    assert _type(console.post(f"{page}/abort", data={"reason": "no token"})) == (403, "csrf_failed")
    assert _type(console.post(f"{page}/abort", data={"csrf_token": csrf, "reason": "  "})) == (422, "invalid_request")
    assert _events(session_factory, "cutover.abort_requested") == []  # every refusal changed nothing

    requested_before = _abort_count("requested")
    asked = console.post(f"{page}/abort", data={"csrf_token": csrf, "reason": "wrong region"}, follow_redirects=False)
    assert (asked.status_code, asked.headers["location"]) == (303, page)
    after = console.get(page).text
    assert 'data-testid="abort-requested"' in after and "wrong region" in after and "review-abort" not in after
    again = console.post(f"{page}/abort", data={"csrf_token": csrf, "reason": "again"}, follow_redirects=False)
    assert again.status_code == 303
    (request,) = _events(session_factory, "cutover.abort_requested")  # asking twice is one request
    assert _abort_count("requested") == requested_before + 1  # the second is counted as `repeated`
    assert 'lifeline_cutover_abort_requests_total{outcome="repeated"}' in console.get("/metrics").text
    assert (request.actor, request.reason, request.after["cutover_id"]) == (
        "token:test-operator#2", "wrong region", running.id)

    done = running.finish()
    assert (done.state, done.failure) == ("rolled_back", "aborted by token:test-operator#2: wrong region")
    assert running.scripted.announced["203.0.113.0/24"] is True
    assert 'data-testid="cutover-state">rolled_back' in console.get(page).text
    assert _audit(session_factory, "console.cutover_abort") == [
        ("token:test-viewer#1", 403), ("token:test-operator#2", 403), ("token:test-operator#2", 422),
        ("token:test-operator#2", 303), ("token:test-operator#2", 303)]


def test_a_cutover_that_is_not_running_cannot_be_aborted_and_nothing_changes(
        console: TestClient, tokens: dict[str, str], session_factory: Any) -> None:
    csrf = sign_in(console, tokens["operator"])
    planned = console.post("/console/cutovers", data={"csrf_token": csrf, "scope_kind": "zone", "region": "eu",
                                                      "name": "eu-a", "tier": "l7", "reason": "r"},
                           follow_redirects=False)
    page = planned.headers["location"]
    assert "review-abort" not in console.get(page).text
    confirm = console.get(f"{page}/abort").text
    assert "only an executing or verifying cutover can be aborted" in confirm and "abort-form" not in confirm
    with session_factory() as session:
        before = session.query(Cutover).one().revision, len(event_service.list_events(session, EventFilter()))
    assert _type(console.post(f"{page}/abort", data={"csrf_token": csrf, "reason": "r"})) == (
        409, "invalid_transition")
    assert _type(console.post("/console/cutovers/999999/abort", data={"csrf_token": csrf, "reason": "r"})) == (
        404, "cutover_not_found")
    with session_factory() as session:
        assert (session.query(Cutover).one().revision, len(event_service.list_events(session, EventFilter()))) == before


def test_the_stop_switch_is_stopped_by_an_operator_and_released_by_an_admin_behind_confirmations(
        console: TestClient, tokens: dict[str, str], session_factory: Any, running: Running) -> None:
    viewer_csrf = sign_in(console, tokens["viewer"])
    assert "review-gate" not in console.get("/console/cutovers").text
    assert _type(console.post("/console/cutover-gate", data={"csrf_token": viewer_csrf, "stopped": "on",
                                                             "reason": "v", "expected_revision": "0"})) == (
        403, "forbidden")

    csrf = sign_in(console, tokens["operator"])
    listing = console.get("/console/cutovers").text
    assert 'data-testid="review-gate">Review stopping every new cutover' in listing
    confirm = console.get("/console/cutover-gate").text
    assert f'data-testid="gate-running-{running.id}"' in confirm and "refused at its next step" in confirm
    form = {"csrf_token": csrf_of(confirm), "stopped": "on", "expected_revision": "0", "reason": "incident 7"}
    assert 'name="stopped" value="on"' in confirm and 'name="expected_revision" value="0"' in confirm
    assert _type(console.post("/console/cutover-gate", data={**form, "stopped": "maybe"})) == (422, "invalid_request")
    assert _type(console.post("/console/cutover-gate", data={**form, "expected_revision": "x"})) == (
        422, "invalid_request")
    assert _type(console.post("/console/cutover-gate", data={**form, "reason": ""})) == (422, "invalid_request")
    assert _events(session_factory, "cutover.gate") == []

    stopped = console.post("/console/cutover-gate", data=form, follow_redirects=False)
    assert (stopped.status_code, stopped.headers["location"]) == (303, "/console/cutovers")
    assert "<strong>ON</strong>" in console.get("/console/cutovers").text
    assert _type(console.post("/console/cutover-gate", data=form)) == (409, "gate_conflict")  # the same form again
    (gate,) = _events(session_factory, "cutover.gate")
    assert (gate.actor, gate.reason, gate.after) == ("token:test-operator#2", "incident 7",
                                                     {"stopped": True, "revision": 1})

    done = running.finish()  # the running cutover meets the switch at its next step
    assert (done.state, done.failure) == ("rolled_back", "step 2: refused by gating.stop_switch")

    release_page = console.get("/console/cutover-gate").text
    assert 'data-testid="gate-needs-admin"' in release_page and "gate-form" not in release_page
    release = {"csrf_token": csrf, "stopped": "off", "expected_revision": "1", "reason": "over"}
    assert _type(console.post("/console/cutover-gate", data=release)) == (403, "forbidden")
    assert len(_events(session_factory, "cutover.gate")) == 1

    admin_csrf = sign_in(console, tokens["admin"])
    admin_page = console.get("/console/cutover-gate").text
    assert 'name="stopped" value="off"' in admin_page and 'name="expected_revision" value="1"' in admin_page
    released = console.post("/console/cutover-gate", data={**release, "csrf_token": admin_csrf},
                            follow_redirects=False)
    assert released.status_code == 303 and "<strong>ON</strong>" not in console.get("/console/cutovers").text
    assert [(e.actor, e.after["stopped"]) for e in _events(session_factory, "cutover.gate")] == [
        ("token:test-operator#2", True), ("token:test-admin#3", False)]
    assert [s for _, s in _audit(session_factory, "console.gate_set")] == [403, 422, 422, 422, 303, 409, 403, 303]
