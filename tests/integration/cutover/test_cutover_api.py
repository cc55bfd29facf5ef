"""The cutover and zonal-shift REST API, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from common.clock import ManualClock
from controlplane.app import create_app
from controlplane.config import ControlPlaneSettings
from controlplane.topology.lease import InMemoryLeaseReader
from cutover.runtime import CutoverRuntime
from tests.integration.cutover.test_cutover_support import (  # noqa: F401 - fixtures
    ScriptedDriver,
    policy,
    read_factory,
    runtime,
    scripted,
    topology_two_regions,
)
from tests.support.answer_contract import AnswerContract

pytestmark = pytest.mark.usefixtures("topology_two_regions")

EU = {"scope": {"kind": "region", "region": "eu"}, "tier": "l7", "target_state": "out", "reason": "eu degraded"}


@pytest.fixture
def api(settings: ControlPlaneSettings, runtime: CutoverRuntime, clock: ManualClock,
        lease_reader: InMemoryLeaseReader, answer_contract: AnswerContract) -> Iterator[TestClient]:
    app = create_app(settings, clock=clock, lease_reader=lease_reader)
    app.state.cutover_runtime = runtime
    with answer_contract.watch(TestClient(app, raise_server_exceptions=False)) as client:
        yield client


def error_type(response: Any) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["type"]


def test_plan_execute_show_list_rollback(api: TestClient, as_role: Any) -> None:
    op, viewer = as_role("operator"), as_role("viewer")
    assert error_type(api.post("/api/v1/cutovers", json=EU, headers=viewer)) == (403, "forbidden")
    planned = api.post("/api/v1/cutovers", json=EU, headers=op)
    assert planned.status_code == 201, planned.text
    body = planned.json()
    assert (body["state"], body["scope"], body["safety"]) == ("planned", "region:eu", [])
    assert [(s["expected_before"]["state"], s["expected_after"]["state"]) for s in body["steps"]] == [
        ("active", "draining")] * 2
    cutover_id = body["id"]

    done = api.post(f"/api/v1/cutovers/{cutover_id}/execute", json={"idempotency_key": "req-1"}, headers=op)
    assert done.status_code == 200, done.text
    assert (done.json()["state"], done.json()["executed_by"]) == ("completed", "token:test-operator#2")
    again = api.post(f"/api/v1/cutovers/{cutover_id}/execute", json={"idempotency_key": "req-1"}, headers=op)
    assert again.json()["revision"] == done.json()["revision"]

    steps = api.get("/api/v1/events", params={"routing_tier": "l7", "kind": "cutover.step"}, headers=viewer).json()
    assert [(e["scope"], e["outcome"], e["reason"]) for e in steps] == [("region:eu", "succeeded", "eu degraded")] * 2

    assert api.get(f"/api/v1/cutovers/{cutover_id}", headers=viewer).json()["state"] == "completed"
    listed = api.get("/api/v1/cutovers", params={"state": "completed", "scope": "region:eu"}, headers=viewer).json()
    assert [c["id"] for c in listed] == [cutover_id]
    assert error_type(api.get("/api/v1/cutovers/999", headers=viewer)) == (404, "cutover_not_found")

    back = api.post(f"/api/v1/cutovers/{cutover_id}/rollback", json={"reason": "eu is fine"}, headers=op)
    assert back.status_code == 200 and back.json()["state"] == "rolled_back"
    assert [s["status"] for s in back.json()["steps"]] == ["reverted", "reverted"]
    assert error_type(api.post(f"/api/v1/cutovers/{cutover_id}/execute", json={"idempotency_key": "req-2"},
                               headers=op)) == (409, "invalid_transition")


def test_the_last_serving_region_needs_break_glass_from_an_admin(api: TestClient, as_role: Any) -> None:
    op, admin = as_role("operator"), as_role("admin")
    eu = api.post("/api/v1/cutovers", json=EU, headers=op).json()["id"]
    api.post(f"/api/v1/cutovers/{eu}/execute", json={"idempotency_key": "eu"}, headers=op)
    us_plan = api.post("/api/v1/cutovers", json={**EU, "scope": {"kind": "region", "region": "us"}}, headers=op).json()
    assert [v["rule"] for v in us_plan["safety"]] == ["assertion.serving_region"]
    url = f"/api/v1/cutovers/{us_plan['id']}/execute"
    assert error_type(api.post(url, json={"idempotency_key": "us"}, headers=op)) == (409, "safety_rule_violation")
    glass = {"idempotency_key": "us", "break_glass": True, "break_glass_reason": "both regions are bad"}
    assert error_type(api.post(url, json=glass, headers=op)) == (403, "break_glass_needs_admin")
    assert error_type(api.post(url, json={**glass, "break_glass_reason": None}, headers=admin)) == (
        422, "break_glass_needs_reason")
    done = api.post(url, json=glass, headers=admin)
    assert done.status_code == 200 and done.json()["break_glass"] is True
    audit = api.get("/api/v1/events", params={"kind": "cutover.break_glass"}, headers=admin).json()
    assert [(e["actor"], e["reason"]) for e in audit] == [("token:test-admin#3", "both regions are bad")]


def test_a_step_that_does_not_verify_answers_rolled_back(
    api: TestClient, as_role: Any, scripted: ScriptedDriver
) -> None:
    op = as_role("operator")
    scripted.never_verify.add("203.0.113.0/24")
    planned = api.post("/api/v1/cutovers", json={**EU, "tier": "anycast"}, headers=op).json()
    done = api.post(f"/api/v1/cutovers/{planned['id']}/execute", json={"idempotency_key": "k"}, headers=op).json()
    assert done["state"] == "rolled_back" and "did not verify" in done["failure"]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({**EU, "scope": {"kind": "zone", "region": "eu"}}, (422, "invalid_request")),
        ({**EU, "scope": {"kind": "region", "region": "eu", "name": "us"}}, (422, "invalid_request")),
        ({**EU, "tier": "carrier-pigeon"}, (422, "invalid_request")),
        ({**EU, "tier": "dns"}, (422, "tier_not_configured")),
        ({**EU, "mode": "automatic"}, (422, "invalid_request")),
        ({**EU, "reason": " "}, (422, "invalid_request")),
        ({**EU, "scope": {"kind": "region", "region": "mars"}}, (404, "region_not_found")),
        ({**EU, "scope": {"kind": "zone", "region": "eu", "name": "eu-z"}}, (404, "zone_not_found")),
    ],
)
def test_bad_plans_are_refused_and_change_nothing(api: TestClient, as_role: Any, body: Any,
                                                  expected: tuple[int, str]) -> None:
    assert error_type(api.post("/api/v1/cutovers", json=body, headers=as_role("operator"))) == expected
    assert api.get("/api/v1/cutovers", headers=as_role("viewer")).json() == []


def test_the_stop_switch_is_set_by_an_operator_and_released_by_an_admin(api: TestClient, as_role: Any) -> None:
    op, admin, viewer = as_role("operator"), as_role("admin"), as_role("viewer")
    assert api.get("/api/v1/cutover-gate", headers=viewer).json()["stopped"] is False
    stopped = api.put("/api/v1/cutover-gate", json={"stopped": True, "reason": "freeze"}, headers=op)
    assert stopped.status_code == 200 and stopped.json()["revision"] == 1
    planned = api.post("/api/v1/cutovers", json=EU, headers=op).json()
    refused = api.post(f"/api/v1/cutovers/{planned['id']}/execute", json={"idempotency_key": "k"}, headers=op)
    assert error_type(refused) == (409, "safety_rule_violation")
    release = {"stopped": False, "reason": "thaw"}
    assert error_type(api.put("/api/v1/cutover-gate", json=release, headers=op)) == (403, "forbidden")
    assert error_type(api.put("/api/v1/cutover-gate", json={**release, "expected_revision": 0}, headers=admin)) == (
        409, "gate_conflict")
    assert api.put("/api/v1/cutover-gate", json=release, headers=admin).json()["stopped"] is False


def test_zonal_shift_start_list_cancel(api: TestClient, as_role: Any, clock: ManualClock) -> None:
    op, viewer = as_role("operator"), as_role("viewer")
    start = {"region": "eu", "zone": "eu-a", "expires_in": "PT2H", "reason": "eu-a loss"}
    assert error_type(api.post("/api/v1/zonal-shifts", json={**start, "expires_in": "PT73H"}, headers=op)) == (
        422, "invalid_expiry")
    assert error_type(api.post("/api/v1/zonal-shifts", json={k: v for k, v in start.items() if k != "expires_in"},
                               headers=op)) == (422, "invalid_request")
    created = api.post("/api/v1/zonal-shifts", json=start, headers=op)
    assert created.status_code == 201, created.text
    shift = created.json()
    assert shift["active"] is True and shift["expires_at"].startswith("2026-01-01T02:00:00")
    assert error_type(api.post("/api/v1/zonal-shifts", json=start, headers=op)) == (409, "zonal_shift_active")
    assert [s["id"] for s in api.get("/api/v1/zonal-shifts", params={"active": True}, headers=viewer).json()] == [
        shift["id"]]
    cluster = api.get("/api/v1/clusters/c-eu-a", headers=viewer).json()
    assert cluster["state"] == "draining"
    assert error_type(api.delete(f"/api/v1/zonal-shifts/{shift['id']}", headers=op)) == (422, "invalid_request")
    ended = api.delete(f"/api/v1/zonal-shifts/{shift['id']}", params={"reason": "fixed"}, headers=op)
    assert ended.status_code == 200 and (ended.json()["active"], ended.json()["end_reason"]) == (False, "cancelled")
    assert api.get("/api/v1/clusters/c-eu-a", headers=viewer).json()["state"] == "active"
    assert api.get("/api/v1/zonal-shifts", params={"active": True}, headers=viewer).json() == []
    assert error_type(api.delete(f"/api/v1/zonal-shifts/{shift['id']}", params={"reason": "again"},
                                 headers=op)) == (409, "zonal_shift_ended")
    assert error_type(api.get("/api/v1/zonal-shifts/77", headers=viewer)) == (404, "zonal_shift_not_found")


def test_abort_is_an_operators_and_refuses_a_cutover_that_is_not_running(api: TestClient, as_role: Any) -> None:
    op = as_role("operator")
    planned = api.post("/api/v1/cutovers", json=EU, headers=op).json()
    url = f"/api/v1/cutovers/{planned['id']}/abort"
    assert api.post(url, json={"reason": "stop"}, headers=as_role("viewer")).status_code == 403
    assert error_type(api.post(url, json={"reason": "stop"}, headers=op)) == (409, "invalid_transition")
    assert error_type(api.post(url, json={}, headers=op)) == (422, "invalid_request")
    assert api.get(f"/api/v1/cutovers/{planned['id']}", headers=op).json()["state"] == "planned"
