"""Which faults a drill may inject on a fleet, decided before anything is touched (no I/O)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from common.clock import ManualClock
from controlplane.drill.errors import OutsideBlastRadius, RegionTierNotWired, UnsupportedDrill
from controlplane.drill.faults import ControlPlaneDown, RedisDown, ZoneLoss, plan_fault, zone_footprint
from controlplane.drill.schemas import BlastRadius, Traffic
from controlplane.drill.states import DrillFault, DrillScope

PLACEMENT = {"a-0": "local-a", "a-1": "local-a", "b-0": "local-b"}


def radius(**overrides: Any) -> BlastRadius:
    return BlastRadius.model_validate({"region": "local", "zones": ["local-a"], "max_instances": 2, **overrides})


def test_zone_footprint_is_every_instance_of_the_zone() -> None:
    assert zone_footprint(radius(), "local-a", PLACEMENT) == ["a-0", "a-1"]


@pytest.mark.parametrize(("overrides", "zone", "placement", "why"), [
    ({}, "local-b", PLACEMENT, "outside the blast radius zones"),
    ({"max_instances": 1}, "local-a", PLACEMENT, "over the blast radius cap of 1"),
    ({"instances": ["a-0"]}, "local-a", PLACEMENT, r"would kill \['a-1'\]"),
    ({}, "local-a", {**PLACEMENT, "x-0": None}, "does not say which zone"),
    ({"zones": ["local-c"]}, "local-c", PLACEMENT, "nothing to drill"),
])
def test_zone_footprint_refuses_what_reaches_outside_the_radius(overrides: dict, zone: str,
                                                                 placement: dict, why: str) -> None:
    with pytest.raises(OutsideBlastRadius, match=why):
        zone_footprint(radius(**overrides), zone, placement)


class _Fleet:
    gateway_url = "http://gw.invalid"
    region = "local"

    def instance_ids(self) -> list[str]:
        return sorted(PLACEMENT)

    def zone_of(self, instance_id: str) -> str | None:
        return PLACEMENT[instance_id]


class _Handle:
    url = "http://cp.invalid"
    token = "t"
    pid = 1  # never the test's own process

    def pause(self) -> None:
        raise AssertionError("planning must not touch anything")

    resume = pause


def plan(fault: DrillFault, scope: DrillScope, fleet: Any = None, target: str | None = None, **radius_overrides: Any):
    clock = ManualClock()
    return plan_fault(scope=scope, fault=fault, radius=radius(**radius_overrides), traffic=Traffic(),
                      fleet=fleet or _Fleet(), target=target, clock=clock, sleep=lambda s: None)


def test_zone_loss_plan_kills_the_zone_and_pins_traffic_there() -> None:
    zone = plan(DrillFault.ZONE_LOSS, DrillScope.ZONE)
    assert isinstance(zone, ZoneLoss) and (zone.target, zone.instances, zone.prefer) == (
        "local-a", ["a-0", "a-1"], ["a-0", "a-1"])


def test_a_fleet_of_another_region_is_outside_the_radius() -> None:
    with pytest.raises(OutsideBlastRadius, match="region"):
        plan(DrillFault.ZONE_LOSS, DrillScope.ZONE, region="eu-west")


def test_region_drill_without_a_second_region_and_dns_tier_is_refused_typed() -> None:
    with pytest.raises(RegionTierNotWired, match=r"region\(s\) \['local'\] and no dns tier") as refused:
        plan(DrillFault.REGION_LOSS, DrillScope.REGION)
    assert refused.value.error_type == "region_tier_not_wired" and refused.value.status_code == 422


def test_outage_faults_need_the_process_they_silence() -> None:
    with pytest.raises(UnsupportedDrill, match="no control-plane process"):
        plan(DrillFault.CONTROLPLANE_DOWN, DrillScope.REGION)
    with pytest.raises(UnsupportedDrill, match="no Redis"):
        plan(DrillFault.REDIS_DOWN, DrillScope.REGION)


def test_controlplane_down_never_stops_the_runners_own_process() -> None:
    fleet = _Fleet()
    own = _Handle()
    own.pid = os.getpid()
    fleet.controlplane = own  # type: ignore[attr-defined]
    with pytest.raises(UnsupportedDrill, match="runner's own process"):
        plan(DrillFault.CONTROLPLANE_DOWN, DrillScope.REGION, fleet)


def test_outage_plans_hold_the_fault_while_traffic_flows() -> None:
    fleet = _Fleet()
    fleet.controlplane = fleet.redis = _Handle()  # type: ignore[attr-defined]
    down = plan(DrillFault.CONTROLPLANE_DOWN, DrillScope.REGION, fleet)
    assert isinstance(down, ControlPlaneDown) and down.keep_traffic and down.hold_s == Traffic().fault_duration_s
    assert not down.expects_tier and down.target == "controlplane:local"
    redis = plan(DrillFault.REDIS_DOWN, DrillScope.REGION, fleet)
    assert isinstance(redis, RedisDown) and redis.target == "redis:local" and redis.slow == sorted(PLACEMENT)
    with pytest.raises(OutsideBlastRadius, match="every zone"):
        plan(DrillFault.REDIS_DOWN, DrillScope.ZONE, fleet)
    with pytest.raises(OutsideBlastRadius, match="region 'local' only"):
        plan(DrillFault.CONTROLPLANE_DOWN, DrillScope.REGION, fleet, target="eu-west")


def test_a_fleet_that_names_no_region_is_the_radiuss_region() -> None:
    fleet = _Fleet()
    fleet.region = None  # type: ignore[assignment]  # a fleet file written before `region:`
    assert plan(DrillFault.ZONE_LOSS, DrillScope.ZONE, fleet, region="eu-west").target == "local-a"


def test_a_fleet_file_carries_zones_and_the_processes_an_outage_drill_may_silence(tmp_path) -> None:
    import yaml

    from controlplane.drill.fleet import FileFleet

    (tmp_path / "cp.pid").write_text("4242\n")
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({
        "gateway_url": "http://gw-a", "gateway_urls": ["http://gw-a", "http://gw-b"], "region": "local",
        "controlplane": {"url": "http://cp/", "token": "ll_x", "pid_file": str(tmp_path / "cp.pid")},
        "instances": {"a-0": {"url": "http://a0", "served_model": "tiny", "zone": "local-a"},
                      "b-0": {"url": "http://b0", "served_model": "tiny", "zone": "local-b"}}}))
    fleet = FileFleet.load(path)
    assert (fleet.zone_of("a-0"), fleet.zone_of("b-0"), fleet.gateway_urls) == ("local-a", "local-b",
                                                                                ["http://gw-a", "http://gw-b"])
    assert (fleet.controlplane.url, fleet.controlplane.token, fleet.controlplane.pid) == ("http://cp", "ll_x", 4242)
    assert fleet.redis is None
    zone = plan(DrillFault.ZONE_LOSS, DrillScope.ZONE, fleet)
    assert zone.instances == ["a-0"]
