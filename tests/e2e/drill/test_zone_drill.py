"""Zone-loss drills on the local fleet: every engine of one zone SIGKILLed under traffic, behind a real gateway.

Promise measured: request and semantic recovery across a lost zone. The run
waits for an operator's approval (nothing is touched before it); approved,
it kills a-0 and a-1 (zone local-a) while greedy and seeded streams are in
flight on both, and passes with every stream token-identical to the
undisturbed run on b-0 (zone local-b), the gateway's `l7` events for both
victims read back in order, and both restarted under newer generations. A
stop condition tripped on purpose aborts it and restarts the zone; a zone
drill whose fault would reach outside its blast radius (another zone, or
more instances than its cap) is refused untouched.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from common.clock import SystemClock
from controlplane.db import session_scope
from controlplane.drill import service
from controlplane.drill.errors import ApprovalRequired, OutsideBlastRadius, RegionTierNotWired
from controlplane.drill.runner import DrillRunner, HttpEventReader
from controlplane.drill.schemas import DrillSpec
from controlplane.drill.states import DrillRunState

ZONE_A = ("a-0", "a-1")


def define(controlplane, *, approve: bool = True, **overrides) -> int:
    body = {"name": "lose-local-a", "model": "tiny", "scope": "zone", "fault": "zone_loss",
            "blast_radius": {"region": "local", "zones": ["local-a"], "max_instances": 2},
            "stop_conditions": {"max_error_rate": 0.5},
            "targets": {"request_rto_s": 30.0, "token_rpo_tokens": 0, "rto_quality_s": 180.0},
            "traffic": {"requests": 4, "concurrency": 2, "max_tokens": 24, "fault_after_tokens": 6,
                        "token_delay_ms": 40.0}}
    spec = DrillSpec.model_validate({**body, **overrides})
    clock = SystemClock()
    with session_scope(controlplane.factory) as session:
        definition = service.define(session, spec=spec, actor="test", clock=clock)
        run = service.create_run(session, definition=definition, trigger="manual", actor="test", clock=clock)
        assert run.state == "awaiting_approval"
        if approve:
            service.approve(session, run_id=run.id, actor="operator:alice", clock=clock)
        return run.id


def runner(controlplane, fleet, tmp_path: Path) -> DrillRunner:
    return DrillRunner(factory=controlplane.factory, fleet=fleet, clock=SystemClock(),
                       events=HttpEventReader(controlplane.url, controlplane.tokens["viewer"]),
                       report_dir=tmp_path / "reports")


def pids(fleet) -> dict[str, int]:
    return {i: e.process.pid for i, e in fleet.engines.items() if e.process.poll() is None}


def test_zone_drill_waits_for_approval_then_loses_the_zone_token_identical(controlplane, zone_fleet, tmp_path):
    run_id = define(controlplane, approve=False)
    before = pids(zone_fleet)
    with pytest.raises(ApprovalRequired):
        runner(controlplane, zone_fleet, tmp_path).run(run_id)
    assert pids(zone_fleet) == before  # nothing touched while it waits
    with session_scope(controlplane.factory) as session:
        assert service.get_run_or_raise(session, run_id=run_id).state == "awaiting_approval"
        service.approve(session, run_id=run_id, actor="operator:alice", clock=SystemClock())

    generations = zone_fleet.gateway.leases()
    outcome = runner(controlplane, zone_fleet, tmp_path).run(run_id)
    report = outcome.report
    assert outcome.state == DrillRunState.PASSED, report["follow_ups"]
    assert report["fault_target"] == "local-a"
    assert report["fault_details"]["instances_killed"] == list(ZONE_A)
    assert report["measured"]["token_rpo_tokens"] == 0
    assert report["measured"]["requests_lost"] == 0
    assert report["migrated_streams"] >= 2  # a stream was in flight on each victim and moved to b-0
    assert report["measured"]["recomputed_decode_tokens"] is not None  # the gateway's count, read before and after
    assert report["measured"]["request_rto_s"] is not None and report["measured"]["detection_s"] is not None
    # The gateway's own ejections, in order, one per lost engine (the local fleet has no zonal-shift tier wired).
    suppressed = [e for e in report["events"] if e["routing_tier"] == "l7" and e["kind"] == "instance.suppressed"]
    assert {i for i in ZONE_A if any(i in (e["scope"] or "") for e in suppressed)} == set(ZONE_A)
    assert [e["id"] for e in report["events"]] == sorted(e["id"] for e in report["events"])
    # Rolled back: both victims serve again under newer generations; the other zone was never touched.
    after = zone_fleet.gateway.leases()
    assert all(after[i] > generations[i] for i in ZONE_A)
    assert after["b-0"] == generations["b-0"] and pids(zone_fleet)["b-0"] == before["b-0"]
    with session_scope(controlplane.factory) as session:
        run = service.get_run_or_raise(session, run_id=run_id)
        assert (run.state, run.approved_by, run.fault_target) == ("passed", "operator:alice", "local-a")
    assert "## RTO measured vs target" in Path(report["files"][0]).read_text()


def test_zone_drill_stop_condition_aborts_and_restarts_the_zone(controlplane, zone_fleet, tmp_path):
    run_id = define(controlplane, name="lose-local-a-strict",
                    stop_conditions={"max_error_rate": None, "ttft_p99_ms": 0.001, "min_requests": 1},
                    traffic={"requests": 8, "concurrency": 2, "max_tokens": 8, "fault_after_tokens": 0})
    generations = zone_fleet.gateway.leases()
    survivor = pids(zone_fleet)["b-0"]
    outcome = runner(controlplane, zone_fleet, tmp_path).run(run_id)
    assert outcome.state == DrillRunState.ABORTED
    assert outcome.report["aborted"].startswith("TTFT p99")
    assert outcome.report["requests"] < 8
    after = zone_fleet.gateway.leases()
    assert all(after[i] > generations[i] for i in ZONE_A)  # the zone was brought back
    assert pids(zone_fleet)["b-0"] == survivor
    zone_fleet.gateway.wait_routable("tiny", 3)


@pytest.mark.parametrize(("overrides", "target", "why"), [
    ({}, "local-b", "outside the blast radius zones"),  # the other zone
    ({"blast_radius": {"region": "local", "zones": ["local-a"], "max_instances": 1}}, None, "cap"),
    ({"blast_radius": {"region": "local", "zones": ["local-a"], "instances": ["a-0"], "max_instances": 2}}, None,
     "does not name"),
])
def test_zone_drill_that_would_reach_outside_its_blast_radius_is_refused_untouched(
        controlplane, zone_fleet, tmp_path, overrides, target, why):
    run_id = define(controlplane, name=f"lose-refused-{why.split()[0]}", **overrides)
    before, generations = pids(zone_fleet), zone_fleet.gateway.leases()
    with pytest.raises(OutsideBlastRadius, match=why):
        runner(controlplane, zone_fleet, tmp_path).run(run_id, target=target)
    assert pids(zone_fleet) == before and zone_fleet.gateway.leases() == generations
    with session_scope(controlplane.factory) as session:
        run = service.get_run_or_raise(session, run_id=run_id)
        assert run.state == "aborted" and run.abort_reason.startswith("refused") and run.started_at is None


def test_region_drill_on_a_fleet_without_a_second_region_is_refused_typed(controlplane, zone_fleet, tmp_path):
    spec = DrillSpec.model_validate({"name": "lose-region", "model": "tiny", "scope": "region",
                                     "fault": "region_loss", "blast_radius": {"region": "local"},
                                     "expected_tier": "dns"})
    clock = SystemClock()
    with session_scope(controlplane.factory) as session:
        definition = service.define(session, spec=spec, actor="test", clock=clock)
        run_id = service.create_run(session, definition=definition, trigger="manual", actor="test", clock=clock).id
        service.approve(session, run_id=run_id, actor="operator:alice", clock=clock)
    before, generations = pids(zone_fleet), zone_fleet.gateway.leases()
    with pytest.raises(RegionTierNotWired, match=r"region\(s\) \['local'\] and no dns tier") as refused:
        runner(controlplane, zone_fleet, tmp_path).run(run_id)
    assert (refused.value.error_type, refused.value.status_code) == ("region_tier_not_wired", 422)
    assert pids(zone_fleet) == before and zone_fleet.gateway.leases() == generations
    with session_scope(controlplane.factory) as session:
        run = service.get_run_or_raise(session, run_id=run_id)
        assert run.state == "aborted" and "no dns tier" in run.abort_reason and run.started_at is None


def test_a_zone_run_requested_through_the_api_starts_only_once_approved(controlplane, zone_fleet, tmp_path):
    dispatched: list[int] = []
    drill_runner = runner(controlplane, zone_fleet, tmp_path)
    controlplane.app.state.drill_dispatch = lambda run_id: dispatched.append(run_id) or drill_runner.run(run_id)
    api = httpx.Client(base_url=controlplane.url, headers=controlplane.headers("operator"), timeout=30)
    body = {"name": "monthly-zone", "model": "tiny", "scope": "zone", "fault": "zone_loss",
            "blast_radius": {"region": "local", "zones": ["local-a"], "max_instances": 2},
            "targets": {"token_rpo_tokens": 0},
            "traffic": {"requests": 4, "concurrency": 2, "max_tokens": 16, "fault_after_tokens": 4,
                        "token_delay_ms": 40.0}}
    try:
        assert api.post("/api/v1/drills", json=body).status_code == 201
        run = api.post("/api/v1/drills/monthly-zone/runs").json()
        assert run["state"] == "awaiting_approval"
        time.sleep(1.0)
        assert dispatched == [] and api.get(f"/api/v1/drills/runs/{run['id']}").json()["state"] == "awaiting_approval"
        approved = api.post(f"/api/v1/drills/runs/{run['id']}/approve")
        assert approved.status_code == 200 and approved.json()["approved_by"]
        deadline = time.monotonic() + 240
        while (run := api.get(f"/api/v1/drills/runs/{run['id']}").json())["state"] not in ("passed", "failed",
                                                                                             "aborted"):
            assert time.monotonic() < deadline, run
            time.sleep(0.5)
    finally:
        controlplane.app.state.drill_dispatch = None
    assert dispatched == [run["id"]]
    assert run["state"] == "passed", run["failure"]
    assert run["report"]["measured"]["requests_lost"] == 0 and run["report"]["measured"]["token_rpo_tokens"] == 0
    assert run["report"]["fault_details"]["instances_killed"] == list(ZONE_A)
