"""The workflow's view of a tier: scopes, event tiers, and the adapter onto the typed drivers (cutover/drivers/)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from common.clock import ManualClock
from contract.routing_tier import RoutingTier
from cutover.drivers.adapter import TierDriverAdapter
from cutover.drivers.base import (
    AnycastState,
    AnycastTarget,
    DriverUnavailable,
    L7State,
    L7Target,
)
from cutover.drivers.polling import PollingDriver
from cutover.drivers.step import RecordedOnlyTarget, SnapshotInstanceTarget, describe_target
from cutover.scope import Scope, ScopeKind, TargetState

ZONE_A = AnycastTarget(prefix="203.0.113.10/32", zone="eu-a", next_hop="127.0.0.2")


class MemoryAnycast(PollingDriver[AnycastState]):
    """A BGP speaker in memory; `lag` polls pass before a write shows at the observer."""

    tier = RoutingTier.ANYCAST

    def __init__(self, clock: ManualClock, *, lag: int = 0, down: bool = False) -> None:
        super().__init__(clock=clock, sleep=clock.advance)
        self.announced = {ZONE_A: True}
        self.shown = dict(self.announced)
        self.lag = lag
        self.down = down

    def observe(self, target: AnycastTarget) -> tuple[AnycastState, str]:  # type: ignore[override]
        if self.down:
            raise DriverUnavailable("exabgp is not answering")
        if self.lag:
            self.lag -= 1
        else:
            self.shown = dict(self.announced)
        return AnycastState(target=target, announced=self.shown[target]), f"route {target.prefix}"

    def _write(self, desired: AnycastState) -> None:  # type: ignore[override]
        self.announced[desired.target] = desired.announced


def adapter(driver: MemoryAnycast) -> TierDriverAdapter:
    return TierDriverAdapter(driver, tier=RoutingTier.ANYCAST, name="exabgp",
                             targets_for=lambda scope: [ZONE_A] if scope.name == "eu-a" else [])


@pytest.mark.parametrize(
    ("scope", "key"),
    [(Scope(ScopeKind.REGION, "eu", "eu"), "region:eu"),
     (Scope(ScopeKind.ZONE, "eu", "eu-a"), "region:eu/zone:eu-a"),
     (Scope(ScopeKind.INSTANCE, "eu", "engine-7"), "region:eu/instance:engine-7")],
)
def test_scope_keys_are_the_event_logs_scope_strings(scope: Scope, key: str) -> None:
    assert scope.key == key


def test_one_routing_tier_is_what_the_events_and_cutovers_tables_allow() -> None:
    from sqlalchemy import CheckConstraint

    from controlplane.event.models import Event
    from cutover.models import Cutover, CutoverStep

    assert [t.value for t in RoutingTier] == ["l7", "mesh", "anycast", "dns"]  # fastest first
    for table in (Event.__table__, Cutover.__table__):
        checks = [str(c.sqltext) for c in table.constraints if isinstance(c, CheckConstraint)]
        assert any("('l7', 'mesh', 'anycast', 'dns')" in check for check in checks), table.name
    assert CutoverStep.__table__.c.tier.type.length >= max(len(t.value) for t in RoutingTier)


def test_describe_target_is_stable_and_bounded() -> None:
    assert describe_target(ZONE_A) == "next_hop=127.0.0.2,prefix=203.0.113.10/32,zone=eu-a"
    assert describe_target(RecordedOnlyTarget(tier=RoutingTier.DNS, scope="region:eu")) == (
        "recorded_only=True,scope=region:eu")
    assert len(describe_target(SnapshotInstanceTarget(region="eu", instance_id="x" * 1000, generation=1))) == 400


def test_the_adapter_plans_applies_and_verifies_the_drivers_own_states() -> None:
    clock = ManualClock()
    driver = MemoryAnycast(clock, lag=3)  # read_state takes one poll of the lag
    tier = adapter(driver)
    (target,) = tier.targets(Scope(ScopeKind.ZONE, "eu", "eu-a"))
    assert target == ZONE_A
    before = tier.read_state(target)
    assert before == AnycastState(target=ZONE_A, announced=True)
    after = tier.desired(before, TargetState.OUT)
    assert after == AnycastState(target=ZONE_A, announced=False)
    tier.apply(after)
    check = tier.verify(after, timedelta(seconds=1))
    assert check.verified and check.observed == after
    assert check.evidence["polls"] == 3 and check.evidence["measured_from"] == "apply"
    assert check.evidence["expected"] == after.model_dump(mode="json")  # the Verification, as JSON


def test_a_verification_timeout_is_a_failed_check_with_the_last_observation() -> None:
    clock = ManualClock()
    driver = MemoryAnycast(clock, lag=10_000)
    tier = adapter(driver)
    after = tier.desired(tier.read_state(ZONE_A), TargetState.OUT)
    tier.apply(after)
    check = tier.verify(after, timedelta(milliseconds=50))
    assert not check.verified
    assert check.observed == AnycastState(target=ZONE_A, announced=True)
    assert check.evidence["evidence"] == "route 203.0.113.10/32"


def test_an_unreachable_tier_is_a_failed_check_not_an_exception() -> None:
    clock = ManualClock()
    tier = adapter(MemoryAnycast(clock, down=True))
    check = tier.verify(AnycastState(target=ZONE_A, announced=False), timedelta(seconds=1))
    assert (check.verified, check.evidence["error"]) == (False, "cutover_driver_unavailable")


def test_default_out_and_in_for_haproxy_servers() -> None:
    from cutover.drivers.adapter import desired_out_in

    server = L7State(target=L7Target(backend="engines", server="s1"), admin_state="ready", weight=100)
    assert desired_out_in(server, TargetState.OUT).admin_state == "drain"
    assert desired_out_in(server, TargetState.IN).admin_state == "ready"


# ---------------------------------------------------------------- mesh weights


@pytest.mark.parametrize(("weights", "moved", "target_state", "expected"), [
    ({"a": 50, "b": 50}, ["a"], TargetState.OUT, {"a": 0, "b": 100}),
    ({"a": 34, "b": 33, "c": 33}, ["c"], TargetState.OUT, {"a": 51, "b": 49, "c": 0}),
    ({"prod": 99, "canary": 1}, ["canary"], TargetState.OUT, {"prod": 100, "canary": 0}),
    ({"a": 0, "b": 100}, ["a"], TargetState.IN, {"a": 50, "b": 50}),
    ({"a": 0, "b": 0, "c": 100}, ["a", "b"], TargetState.IN, {"a": 34, "b": 33, "c": 33}),
    ({"a": 0, "b": 60, "c": 40}, ["a"], TargetState.IN, {"a": 33, "b": 40, "c": 27}),
    ({"a": 3, "b": 7}, ["b"], TargetState.OUT, {"a": 10, "b": 0}),  # the total is kept, not forced to 100
])
def test_mesh_weights_move_the_scope_and_keep_the_total(weights: dict[str, int], moved: list[str],
                                                        target_state: TargetState, expected: dict[str, int]) -> None:
    from cutover.drivers.adapter import mesh_weights

    assert mesh_weights(weights, moved, target_state) == expected


def test_mesh_weights_refuse_to_leave_a_route_empty_or_name_unknown_destinations() -> None:
    from cutover.drivers.adapter import mesh_weights
    from cutover.errors import MeshNoDestinationLeft

    with pytest.raises(MeshNoDestinationLeft, match="no destination with weight"):
        mesh_weights({"a": 100, "b": 0}, ["a"], TargetState.OUT)
    with pytest.raises(MeshNoDestinationLeft, match="no destination \\['z'\\]"):
        mesh_weights({"a": 100}, ["z"], TargetState.OUT)
