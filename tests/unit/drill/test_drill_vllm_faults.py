"""Drills on stock vLLM instances: what can be injected into vLLM is planned, what cannot is refused first.

vLLM has no fault admin, so the reference engine's hang, in-memory weight
corruption and token pacing cannot be injected there: the plan refuses them
with a typed, stable reason (`fault_not_injectable`, 422) before anything is
touched. A kill takes vLLM's whole process group, a stop its engine core
alone (tests/e2e/vllm/test_drill_vllm.py, on real vLLM).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from common.clock import ManualClock
from controlplane.drill.errors import FaultNotInjectable, UnsupportedDrill
from controlplane.drill.faults import BadVersion, InstanceFault, ZoneLoss, plan_fault
from controlplane.drill.fleet import FileFleet, FleetFile
from controlplane.drill.schemas import BlastRadius, Traffic
from controlplane.drill.states import DrillFault, DrillScope


def fleet(tmp_path: Path) -> FileFleet:
    return FileFleet(FleetFile.model_validate({"gateway_url": "http://gw.invalid", "region": "local", "instances": {
        "vllm-0": {"url": "http://127.0.0.1:1", "served_model": "tiny", "zone": "a", "engine": "vllm",
                   "pid_file": str(tmp_path / "vllm-0.pid"), "bad_version": ["vllm", "serve", "/models/other"]},
        "ref-0": {"url": "http://127.0.0.1:2", "served_model": "tiny", "zone": "b"}}}), sleep=lambda s: None)


def plan(tmp_path: Path, fault: DrillFault, target: str, scope: DrillScope = DrillScope.INSTANCE,
         traffic: Traffic | None = None):
    radius = BlastRadius.model_validate({"region": "local", "instances": [target] if scope == "instance" else [],
                                         "zones": [target] if scope == "zone" else [], "max_instances": 1})
    return plan_fault(scope=scope, fault=fault, radius=radius, traffic=traffic or Traffic(), fleet=fleet(tmp_path),
                      target=target, clock=ManualClock(), sleep=lambda s: None)


@pytest.mark.parametrize(("fault", "says"), [
    (DrillFault.HANG, "a decode hang"),
    (DrillFault.CORRUPT_WEIGHTS, "in-memory weight corruption"),
])
def test_a_fault_vllm_has_no_hook_for_is_refused_before_anything(tmp_path: Path, fault: DrillFault,
                                                                 says: str) -> None:
    with pytest.raises(FaultNotInjectable, match=says) as refused:
        plan(tmp_path, fault, "vllm-0")
    assert (refused.value.status_code, refused.value.error_type) == (422, "fault_not_injectable")
    assert "stock vLLM" in str(refused.value) and "sigkill, sigstop or bad_version" in str(refused.value)


@pytest.mark.parametrize(("fault", "target", "scope"), [
    (DrillFault.SIGKILL, "vllm-0", DrillScope.INSTANCE),
    (DrillFault.SIGSTOP, "vllm-0", DrillScope.INSTANCE),
    (DrillFault.ZONE_LOSS, "a", DrillScope.ZONE),
])
def test_a_token_delay_on_a_vllm_the_traffic_would_slow_is_refused(tmp_path: Path, fault: DrillFault, target: str,
                                                                  scope: DrillScope) -> None:
    with pytest.raises(FaultNotInjectable, match=r"token_delay_ms=40 slows \['vllm-0'\]"):
        plan(tmp_path, fault, target, scope, Traffic(token_delay_ms=40.0))
    assert isinstance(plan(tmp_path, DrillFault.SIGKILL, "ref-0", traffic=Traffic(token_delay_ms=40.0)),
                      InstanceFault)  # the reference engine paces through its fault admin


def test_a_fleet_that_cannot_stop_an_engine_is_refused_a_sigstop_drill(tmp_path: Path) -> None:
    class KillOnly:
        region = "local"
        gateway_url = "http://gw.invalid"

        def instance_ids(self) -> list[str]:
            return ["e-0"]

    radius = BlastRadius.model_validate({"region": "local", "instances": ["e-0"]})
    with pytest.raises(UnsupportedDrill, match="no `stop`/`resume`"):
        plan_fault(scope=DrillScope.INSTANCE, fault=DrillFault.SIGSTOP, radius=radius, traffic=Traffic(),
                   fleet=KillOnly(), target=None, clock=ManualClock(), sleep=lambda s: None)


def test_kills_plan_on_vllm_and_the_reference_engine_keeps_its_hooks(tmp_path: Path) -> None:
    assert isinstance(plan(tmp_path, DrillFault.SIGKILL, "vllm-0"), InstanceFault)
    assert isinstance(plan(tmp_path, DrillFault.SIGSTOP, "vllm-0"), InstanceFault)
    assert isinstance(plan(tmp_path, DrillFault.ZONE_LOSS, "a", DrillScope.ZONE), ZoneLoss)
    assert isinstance(plan(tmp_path, DrillFault.HANG, "ref-0"), InstanceFault)


class Events:
    """The runner's EventReader over a list the test appends to."""

    def __init__(self) -> None:
        self.rows: list[dict] = [{"id": 1, "kind": "probe.verdict", "scope": "region:local/instance:vllm-0",
                                  "after": {"verdict": "wrong_output"}, "started_at": "2026-12-02T10:00:00+00:00"}]

    def last_id(self) -> int:
        return max(e["id"] for e in self.rows)

    def events_after(self, after_id: int) -> list[dict]:
        return [e for e in self.rows if e["id"] > after_id]


class Deployer:
    region, gateway_url = "local", "http://gw.invalid"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def instance_ids(self) -> list[str]:
        return ["vllm-0", "ref-0"]

    def can_deploy_bad_version(self, instance_id: str) -> bool:
        return instance_id == "vllm-0"

    def deploy_bad_version(self, instance_id: str) -> None:
        self.calls.append(("bad", instance_id))

    def redeploy(self, instance_id: str) -> None:
        self.calls.append(("good", instance_id))


def bad_version_plan(fleet: object, events: Events | None, clock: ManualClock) -> BadVersion:
    radius = BlastRadius.model_validate({"region": "local", "instances": ["vllm-0"]})
    planned = plan_fault(scope=DrillScope.INSTANCE, fault=DrillFault.BAD_VERSION, radius=radius,
                         traffic=Traffic(fault_duration_s=2.0), fleet=fleet, target="vllm-0", clock=clock,
                         sleep=clock.advance, events=events)
    assert isinstance(planned, BadVersion)
    return planned


def test_a_bad_version_plans_on_vllm_and_is_refused_where_the_fleet_has_no_bad_build(tmp_path: Path) -> None:
    planned = plan(tmp_path, DrillFault.BAD_VERSION, "vllm-0")
    assert isinstance(planned, BadVersion) and planned.hold_s == Traffic().fault_duration_s and planned.keep_traffic
    with pytest.raises(UnsupportedDrill, match="no `bad_version` command"):
        plan(tmp_path, DrillFault.BAD_VERSION, "ref-0")


def test_a_bad_version_reads_the_agents_verdict_back_and_measures_from_the_wrong_build_being_up() -> None:
    events, fleet, clock = Events(), Deployer(), ManualClock()
    planned = bad_version_plan(fleet, events, clock)
    planned.prepare()  # the verdict already in the log is an earlier run's: not this one's
    clock.advance(1.0)
    planned.inject()
    deployed = clock.wall()
    at = datetime.fromtimestamp(deployed + 0.75, UTC).isoformat()
    events.rows.append({"id": 2, "kind": "probe.verdict", "scope": "region:local/instance:ref-0",
                        "after": {"verdict": "wrong_output"}, "started_at": at})  # another instance
    events.rows.append({"id": 3, "kind": "probe.verdict", "scope": "region:local/instance:vllm-0",
                        "after": {"verdict": "timeout"}, "started_at": at})  # another verdict
    planned.tick(clock.now())
    assert planned.verdict is None
    events.rows.append({"id": 4, "kind": "probe.verdict", "scope": "region:local/instance:vllm-0", "actor": "agent:a",
                        "reason": "canary: token 0 is 9, recorded 5", "after": {"verdict": "wrong_output"},
                        "started_at": at})
    planned.clear()
    planned.after_clear()  # the batch arrived after the hold: still found
    assert fleet.calls == [("bad", "vllm-0"), ("good", "vllm-0")]
    assert planned.measurements(0.0, 1.0) == {"canary_detection_s": 0.75}
    assert planned.checks() == [] and planned.details()["verdict"]["id"] == 4


def test_a_bad_version_the_canary_never_judged_is_a_follow_up_not_a_pass() -> None:
    events, clock = Events(), ManualClock()
    planned = bad_version_plan(Deployer(), events, clock)
    planned.prepare()
    planned.inject()
    planned.clear()
    planned.after_clear()  # waits its bound on the clock, then gives up
    assert planned.measurements(0.0, 1.0) == {"canary_detection_s": None}
    assert planned.checks() == ["the agent's canary never judged vllm-0 wrong_output while it served another "
                                "version's weights under the model's name"]
    unwired = bad_version_plan(Deployer(), None, clock)
    unwired.inject()
    assert "could not be read back" in unwired.checks()[0]
