"""A fleet file that describes a second region and its dns tier: a region drill is planned, not refused."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from common.clock import ManualClock
from controlplane.drill.errors import RegionTierNotWired
from controlplane.drill.faults import RegionLoss, plan_fault
from controlplane.drill.fleet import FileFleet
from controlplane.drill.schemas import BlastRadius, Traffic
from controlplane.drill.states import DrillFault, DrillScope
from controlplane.drill.tiers import DnsObserver

ANSWERS = {"eu": ["192.0.2.10"], "us": ["198.51.100.10"]}


@pytest.fixture
def processes():
    """Stand-in processes (sleep) whose pids the fleet file names; killed after."""
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        started.append(subprocess.Popen(["sleep", "60"]))
        return started[-1]

    start.started = started  # type: ignore[attr-defined]
    yield start
    for process in started:
        process.kill()
        process.wait()


def two_regions(tmp_path: Path, processes: Any, **overrides: Any) -> dict[str, Any]:
    pids = {}
    for name in ("gw-eu", "gw-us", "eu-a-1", "us-a-1"):
        pids[name] = tmp_path / f"{name}.pid"
        pids[name].write_text(f"{processes().pid}\n")
    return {
        "gateway_url": "http://gw-eu.invalid", "region": "eu",
        "instances": {
            "eu-a-1": {"url": "http://eu-a-1.invalid", "served_model": "tiny", "zone": "eu-a",
                       "pid_file": str(pids["eu-a-1"])},
            "us-a-1": {"url": "http://us-a-1.invalid", "served_model": "tiny", "zone": "us-a", "region": "us",
                       "pid_file": str(pids["us-a-1"])}},
        "regions": {"eu": {"gateways": {"gw-eu": {"url": "http://gw-eu.invalid", "pid_file": str(pids["gw-eu"])}}},
                    "us": {"gateways": {"gw-us": {"url": "http://gw-us.invalid", "pid_file": str(pids["gw-us"])}}}},
        "dns": {"server": "127.0.0.1", "port": 5353, "name": "api.lifeline.test.", "answers": ANSWERS},
        "cutovers": {"controlplane_url": "http://cp.invalid", "token": "ll_operator"},
        **overrides,
    }


def load(tmp_path: Path, body: dict[str, Any]) -> FileFleet:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(body))
    return FileFleet.load(path)


def plan_region_loss(fleet: FileFleet, **radius: Any) -> Any:
    return plan_fault(scope=DrillScope.REGION, fault=DrillFault.REGION_LOSS,
                      radius=BlastRadius.model_validate({"region": "eu", "max_instances": 2, **radius}),
                      traffic=Traffic(), fleet=fleet, target=None, clock=ManualClock(), sleep=lambda s: None,
                      expected_tier="dns")


def test_a_fleet_file_with_two_regions_and_a_dns_tier_plans_the_region_loss(tmp_path, processes):
    fleet = load(tmp_path, two_regions(tmp_path, processes))
    assert fleet.regions() == ["eu", "us"]
    where = {name: region for name, (region, pid) in fleet.all_processes().items() if pid is not None}
    assert where == {"eu-a-1": "eu", "us-a-1": "us", "gateway:gw-eu": "eu", "gateway:gw-us": "us"}
    plan = plan_region_loss(fleet)  # what the Celery task's runner does with FileFleet.load(fleet_file)
    assert isinstance(plan, RegionLoss)
    assert (plan.target, sorted(plan.instances), plan.slow) == ("eu", ["eu-a-1", "gateway:gw-eu"], ["eu-a-1"])
    assert plan.watch is not None and plan.watch.observer.region_answer == ANSWERS["eu"]
    assert plan.watch.cutovers.url == "http://cp.invalid/api/v1"


def test_the_region_loss_kills_the_regions_gateway_by_its_pid_file_and_nothing_else(tmp_path, processes):
    fleet = load(tmp_path, two_regions(tmp_path, processes))
    before = fleet.all_processes()
    fleet.kill_process("gateway:gw-eu")
    by_pid = {p.pid: p for p in processes.started}
    assert by_pid[before["gateway:gw-eu"][1]].wait(timeout=10) == -9  # SIGKILL, reaped
    after = fleet.all_processes()
    assert after["gateway:gw-eu"][1] is None
    assert {n: p for n, p in after.items() if n != "gateway:gw-eu"} == {
        n: p for n, p in before.items() if n != "gateway:gw-eu"}
    assert all(by_pid[pid].poll() is None for n, (_, pid) in after.items() if n != "gateway:gw-eu")

def test_clients_go_to_the_region_the_dns_server_answers(tmp_path, processes, monkeypatch):
    fleet = load(tmp_path, two_regions(tmp_path, processes))
    answer = {"now": ANSWERS["eu"]}
    monkeypatch.setattr(DnsObserver, "answer", lambda self: answer["now"])
    assert fleet.resolve_gateway() == "http://gw-eu.invalid"
    answer["now"] = ANSWERS["us"]
    assert fleet.resolve_gateway() == "http://gw-us.invalid"


def test_a_fleet_file_of_one_region_still_refuses_the_region_drill(tmp_path, processes):
    body = two_regions(tmp_path, processes)
    for key in ("regions", "dns", "cutovers"):
        body.pop(key)
    body["instances"]["us-a-1"].pop("region")
    with pytest.raises(RegionTierNotWired, match="no dns tier"):
        plan_region_loss(load(tmp_path, body))


@pytest.mark.parametrize(("change", "why"), [
    ({"dns": None}, "dns and cutovers"),
    ({"region": "ap"}, "must be one of regions"),
    ({"dns": {"server": "127.0.0.1", "name": "x.", "answers": {"eu": ["192.0.2.10"], "ap": ["192.0.2.99"]}}},
     r"no address for region\(s\) \['us'\]"),
])
def test_a_half_described_region_tier_fails_when_the_file_is_read(tmp_path, processes, change, why):
    with pytest.raises(ValidationError, match=why):
        load(tmp_path, two_regions(tmp_path, processes, **change))
