"""Region loss and the anycast zone drill, planned and watched on fakes (no I/O, virtual time)."""

from __future__ import annotations

from typing import Any

import pytest

from common.clock import ManualClock
from controlplane.drill.errors import OutsideBlastRadius, UnsupportedDrill
from controlplane.drill.faults import RegionLoss, ZoneLoss, plan_fault, region_footprint
from controlplane.drill.schemas import BlastRadius, Traffic
from controlplane.drill.states import DrillFault, DrillScope
from controlplane.drill.tiers import CutoverWatch

ENGINES = {"eu-a-1": "eu-a", "eu-b-1": "eu-b", "us-a-1": "us-a"}
PLACEMENT = {"eu-a-1": "eu", "eu-b-1": "eu", "us-a-1": "us", "gateway:gw-eu": "eu", "gateway:gw-us": "us",
             "tier:named": "tier"}


def radius(**overrides: Any) -> BlastRadius:
    return BlastRadius.model_validate({"region": "eu", "max_instances": 2, **overrides})


def test_region_footprint_is_every_process_of_the_region() -> None:
    assert region_footprint(radius(), "eu", PLACEMENT, ENGINES) == ["eu-a-1", "eu-b-1", "gateway:gw-eu"]
    assert region_footprint(radius(zones=["eu-a", "eu-b"], instances=["eu-a-1", "eu-b-1"]), "eu", PLACEMENT,
                            ENGINES) == ["eu-a-1", "eu-b-1", "gateway:gw-eu"]


@pytest.mark.parametrize(("overrides", "region", "placement", "why"), [
    ({}, "us", PLACEMENT, "outside the blast radius region"),
    ({"max_instances": 1}, "eu", PLACEMENT, "cap of 1"),
    ({"instances": ["eu-a-1"]}, "eu", PLACEMENT, r"would kill \['eu-b-1'\]"),
    ({"zones": ["eu-a"]}, "eu", PLACEMENT, r"zone\(s\) \['eu-b'\] too"),
    ({}, "eu", {**PLACEMENT, "gateway:gw-x": None}, "does not say which region"),
    ({}, "eu", {"us-a-1": "us", "gateway:gw-eu": "eu"}, "no engine of the fleet is in region"),
])
def test_region_footprint_refuses_what_reaches_outside_the_radius(overrides, region, placement, why) -> None:
    with pytest.raises(OutsideBlastRadius, match=why):
        region_footprint(radius(**overrides), region, placement, ENGINES)


class FakeTier:
    def __init__(self, tier: str) -> None:
        self.tier = tier
        self.is_out: bool | None = False
        self.reads = 0

    def out(self) -> bool | None:
        self.reads += 1
        return self.is_out

    def observer(self, _: str) -> FakeTier:
        return self


class FakeCutovers:
    """The control plane's records: `made` appear once the fault is injected; rollback marks them."""

    def __init__(self, tier: FakeTier, scope: str) -> None:
        self.tier, self.scope = tier, scope
        self.records: list[dict[str, Any]] = [{"id": 1, "scope": scope, "tier": tier.tier, "mode": "manual",
                                               "state": "rolled_back"}]
        self.rollbacks: list[int] = []

    def cut_over(self) -> None:
        self.records.append({"id": 2, "scope": self.scope, "tier": self.tier.tier, "mode": "automatic",
                             "state": "completed", "planned_by": "token:agent#1"})
        self.tier.is_out = True

    def of_scope(self, scope: str) -> list[dict[str, Any]]:
        return [dict(c) for c in self.records if c["scope"] == scope]

    def under(self, scope: str) -> list[dict[str, Any]]:
        return [dict(c) for c in self.records if c["scope"] == scope or c["scope"].startswith(scope + "/")]

    def rollback(self, cutover_id: int, reason: str) -> dict[str, Any]:
        self.rollbacks.append(cutover_id)
        record = next(c for c in self.records if c["id"] == cutover_id)
        record["state"] = "rolled_back"
        self.tier.is_out = False
        return dict(record)


class RegionFleet:
    gateway_url = "http://gw-eu.invalid"
    region = "eu"

    def __init__(self) -> None:
        self.dns_tier = FakeTier("dns")
        self.anycast_tier = FakeTier("anycast")
        self.cutovers = FakeCutovers(self.dns_tier, "region:eu")
        self.pids = {name: 100 + i for i, name in enumerate(PLACEMENT)}
        self.killed: list[str] = []
        self.restored: list[str] = []

    def regions(self) -> list[str]:
        return ["eu", "us"]

    def instance_ids(self) -> list[str]:
        return sorted(ENGINES)

    def zone_of(self, instance_id: str) -> str | None:
        return ENGINES[instance_id]

    def all_processes(self) -> dict[str, tuple[str, int | None]]:
        return {name: (PLACEMENT[name], self.pids.get(name)) for name in PLACEMENT}

    def kill_process(self, name: str) -> None:
        self.killed.append(name)
        self.pids.pop(name)

    def restore_region(self, region: str) -> None:
        self.restored.append(region)
        for name, where in PLACEMENT.items():
            if where == region and name not in self.pids:
                self.pids[name] = 900 + len(self.pids)


def plan(fleet: Any, *, fault=DrillFault.REGION_LOSS, scope=DrillScope.REGION, expected_tier="dns", **overrides):
    clock = ManualClock()
    return plan_fault(scope=scope, fault=fault, radius=radius(**overrides), traffic=Traffic(fault_duration_s=7.0),
                      fleet=fleet, target=None, clock=clock, sleep=clock.advance, expected_tier=expected_tier)


def test_region_loss_plan_kills_the_region_holds_it_then_returns_it_and_rolls_the_cutover_back() -> None:
    fleet = RegionFleet()
    region = plan(fleet)
    assert isinstance(region, RegionLoss) and region.target == "eu" and region.keep_traffic
    assert region.hold_s == 7.0 and region.slow == ["eu-a-1", "eu-b-1"] and region.prefer == []
    assert fleet.killed == []  # planned, nothing touched
    region.prepare()
    region.inject()
    assert fleet.killed == ["eu-a-1", "eu-b-1", "gateway:gw-eu"]
    fleet.cutovers.cut_over()  # the agent's region fault → the control plane's dns cutover
    region.tick(0.5)
    region.clear()
    assert fleet.restored == ["eu"] and fleet.cutovers.rollbacks == [2]
    assert region.checks() == []
    details = region.details()
    assert details["processes_killed"] == {"eu-a-1": 100, "eu-b-1": 101, "gateway:gw-eu": 103}
    assert all(details["outside_untouched"].values()) and details["cutover"]["rolled_back"] == [2]
    assert region.measurements(0.0, 7.0)["dns_moved_out_s"] is not None


def test_region_loss_reports_a_cutover_that_never_came_and_a_process_outside_that_changed() -> None:
    fleet = RegionFleet()
    region = plan(fleet)
    region.prepare()
    region.inject()
    fleet.pids["gateway:gw-us"] = 4242  # something else restarted it meanwhile
    region.clear()
    problems = " | ".join(region.checks())
    assert "no automatic dns cutover of region:eu ended" in problems
    assert "never showed region:eu out" in problems
    assert "outside the blast radius changed during the drill: ['gateway:gw-us']" in problems


def test_region_loss_is_refused_when_the_record_already_points_away_or_another_tier_is_expected() -> None:
    fleet = RegionFleet()
    fleet.dns_tier.is_out = True
    with pytest.raises(UnsupportedDrill, match="already routes eu away"):
        plan(fleet).prepare()
    with pytest.raises(UnsupportedDrill, match="dns tier"):
        plan(RegionFleet(), expected_tier="anycast")
    assert fleet.killed == []


def test_zone_drill_expecting_anycast_watches_birds_routes_and_rolls_the_withdrawal_back() -> None:
    fleet = RegionFleet()
    restarted: list[str] = []
    fleet.kill = fleet.killed.append  # type: ignore[attr-defined]
    fleet.restart = restarted.append  # type: ignore[attr-defined]
    fleet.cutovers = FakeCutovers(fleet.anycast_tier, "region:eu/zone:eu-a")
    zone = plan(fleet, fault=DrillFault.ZONE_LOSS, scope=DrillScope.ZONE, expected_tier="anycast",
                zones=["eu-a"], max_instances=1)
    assert isinstance(zone, ZoneLoss) and zone.watch is not None and zone.watch.scope == "region:eu/zone:eu-a"
    zone.prepare()
    zone.inject()
    fleet.cutovers.cut_over()
    zone.tick(0.3)
    zone.clear()
    assert (fleet.killed, restarted, fleet.cutovers.rollbacks) == (["eu-a-1"], ["eu-a-1"], [2])
    assert zone.checks() == [] and zone.details()["cutover"]["cutovers"][0]["tier"] == "anycast"
    # An l7 zone drill watches nothing; one expecting anycast on a fleet without it is refused.
    assert plan(fleet, fault=DrillFault.ZONE_LOSS, scope=DrillScope.ZONE, expected_tier="l7",
                zones=["eu-a"], max_instances=1).watch is None
    del fleet.anycast_tier
    with pytest.raises(UnsupportedDrill, match="no anycast tier"):
        plan(fleet, fault=DrillFault.ZONE_LOSS, scope=DrillScope.ZONE, expected_tier="anycast", zones=["eu-a"],
             max_instances=1)


def test_a_watch_that_rolled_back_but_never_saw_the_scope_back_says_so() -> None:
    tier = FakeTier("dns")
    cutovers = FakeCutovers(tier, "region:eu")
    clock = ManualClock()
    watch = CutoverWatch(scope="region:eu", observer=tier, cutovers=cutovers, clock=clock, sleep=clock.advance,
                         return_timeout_s=2.0)
    watch.prepare()
    cutovers.cut_over()
    watch.wait_for_cutover()
    cutovers.rollback = lambda cutover_id, reason: {"id": cutover_id, "state": "completed"}  # type: ignore
    watch.roll_back("drill")
    problems = " | ".join(watch.checks(injected=True))
    assert "did not show region:eu back within 2 s" in problems and "not rolled back: [(2, 'completed')]" in problems


def test_returning_a_region_rolls_back_the_zone_cutover_its_uneven_return_caused() -> None:
    fleet = RegionFleet()
    region = plan(fleet)
    region.prepare()
    region.inject()
    fleet.cutovers.cut_over()
    original_restore = fleet.restore_region

    def uneven_return(name: str) -> None:  # eu-b back first: the agent withdraws eu-a meanwhile
        original_restore(name)
        fleet.cutovers.records.append({"id": 3, "scope": "region:eu/zone:eu-a", "tier": "anycast",
                                       "mode": "automatic", "state": "completed"})

    fleet.restore_region = uneven_return  # type: ignore[method-assign]
    region.clear()
    assert fleet.cutovers.rollbacks == [2, 3] and region.checks() == []
    cutover = region.details()["cutover"]
    assert cutover["inside_rolled_back"] == [3] and cutover["inside"][0]["scope"] == "region:eu/zone:eu-a"
