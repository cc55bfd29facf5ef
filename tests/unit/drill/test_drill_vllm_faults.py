"""Drills on stock vLLM instances: what can be injected into vLLM is planned, what cannot is refused first.

vLLM has no fault admin, so the reference engine's hang, in-memory weight
corruption and token pacing cannot be injected there: the plan refuses them
with a typed, stable reason (`fault_not_injectable`, 422) before anything is
touched. A kill takes vLLM's whole process group, a stop its engine core
alone (tests/e2e/vllm/test_drill_vllm.py, on real vLLM).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from common.clock import ManualClock
from controlplane.drill.errors import FaultNotInjectable, UnsupportedDrill
from controlplane.drill.faults import InstanceFault, ZoneLoss, plan_fault
from controlplane.drill.fleet import FileFleet, FleetFile
from controlplane.drill.schemas import BlastRadius, Traffic
from controlplane.drill.states import DrillFault, DrillScope


def fleet(tmp_path: Path) -> FileFleet:
    return FileFleet(FleetFile.model_validate({"gateway_url": "http://gw.invalid", "region": "local", "instances": {
        "vllm-0": {"url": "http://127.0.0.1:1", "served_model": "tiny", "zone": "a", "engine": "vllm",
                   "pid_file": str(tmp_path / "vllm-0.pid")},
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
    assert "stock vLLM" in str(refused.value) and "sigkill or sigstop" in str(refused.value)


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
