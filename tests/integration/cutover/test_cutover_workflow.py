"""The cutover workflow through its service and flows, on SQLite and PostgreSQL, on virtual time."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from common.clock import ManualClock
from contract.routing_tier import RoutingTier
from controlplane.db import session_scope
from controlplane.event import service as event_service
from controlplane.event.repository import EventFilter
from controlplane.snapshot import service as snapshot_service
from controlplane.topology import service as topology
from cutover import flows
from cutover import service as cutover_service
from cutover.errors import (
    BreakGlassNeedsReason,
    CutoverInProgress,
    InvalidTransition,
    NothingToCutOver,
    SafetyRuleViolation,
    ScopeBusy,
    TierNotConfigured,
)
from cutover.models import CutoverMode
from cutover.scope import Scope, ScopeKind, TargetState
from cutover.runtime import CutoverRuntime
from tests.integration.cutover.test_cutover_support import (  # noqa: F401 - fixtures
    ScriptedDriver,
    SimulatedCrash,
    policy,
    read_factory,
    runtime,
    scripted,
    topology_two_regions,
)

pytestmark = pytest.mark.usefixtures("topology_two_regions")

EU = Scope(ScopeKind.REGION, "eu", "eu")
EU_A = Scope(ScopeKind.ZONE, "eu", "eu-a")
US = Scope(ScopeKind.REGION, "us", "us")


def plan(runtime: CutoverRuntime, scope: Scope = EU, tier: RoutingTier = RoutingTier.L7,
         target: TargetState = TargetState.OUT, **kwargs: Any) -> int:
    with session_scope(runtime.factory) as session:
        cutover, _ = cutover_service.plan(
            session, runtime, scope=scope, tiers=[tier], target_state=target, reason="eu is degraded",
            mode=kwargs.pop("mode", CutoverMode.MANUAL), actor="op", **kwargs,
        )
        return cutover.id


def clusters(runtime: CutoverRuntime) -> dict[str, str]:
    with session_scope(runtime.factory) as session:
        return {c.name: c.state for c in topology.list_clusters(session)}


def events(runtime: CutoverRuntime, kind: str | None = None) -> list[Any]:
    with session_scope(runtime.factory) as session:
        return list(event_service.list_events(session, EventFilter(kind=kind), limit=1000))


def snapshot_version(runtime: CutoverRuntime) -> int:
    with session_scope(runtime.factory) as session:
        return snapshot_service.current_version(session)


def test_plan_lists_every_step_and_changes_nothing(runtime: CutoverRuntime) -> None:
    version = snapshot_version(runtime)
    cutover_id = plan(runtime)
    with session_scope(runtime.factory) as session:
        cutover = cutover_service.get_or_raise(session, cutover_id=cutover_id)
        steps = [(s.driver_target, s.expected_before.state, s.expected_after.state, s.status)
                 for s in cutover.steps]
        assert (cutover.state, cutover.scope) == ("planned", "region:eu")
    assert steps == [("cluster=c-eu-a,kind=cluster,region=eu", "active", "draining", "pending"),
                     ("cluster=c-eu-b,kind=cluster,region=eu", "active", "draining", "pending")]
    assert clusters(runtime) == {"c-eu-a": "active", "c-eu-b": "active", "c-us-a": "active"}
    assert snapshot_version(runtime) == version
    assert [e.kind for e in events(runtime) if e.kind.startswith("cutover")] == ["cutover.plan"]


def test_plan_refuses_unconfigured_tiers_and_empty_scopes(runtime: CutoverRuntime) -> None:
    with pytest.raises(TierNotConfigured):
        plan(runtime, tier=RoutingTier.DNS)
    with pytest.raises(NothingToCutOver):
        plan(runtime, scope=Scope(ScopeKind.INSTANCE, "eu", "engine-1"))  # l7 instance needs a generation


def test_region_cutover_drains_its_clusters_and_writes_one_event_per_step(runtime: CutoverRuntime) -> None:
    cutover_id = plan(runtime)
    done = flows.execute(runtime, cutover_id=cutover_id, idempotency_key="k1", actor="token:op#1")
    assert done.state == "completed"
    assert [s.status for s in done.steps] == ["verified", "verified"]
    assert clusters(runtime) == {"c-eu-a": "draining", "c-eu-b": "draining", "c-us-a": "active"}
    step_events = events(runtime, "cutover.step")
    assert len(step_events) == 2
    for event, step in zip(step_events, done.steps, strict=True):
        assert (event.routing_tier, event.actor, event.reason, event.scope, event.outcome) == (
            "l7", "token:op#1", "eu is degraded", "region:eu", "succeeded")
        assert event.before["state"] == step.expected_before.model_dump(mode="json")  # the row's JSON
        assert event.after["state"]["state"] == "draining"
        assert event.after["evidence"]["gateway_reports"].startswith("unavailable")
        assert event.started_at <= event.ended_at
    transitions = [(e.before["state"], e.after["state"]) for e in events(runtime, "cutover.transition")]
    assert transitions == [("planned", "executing"), ("executing", "verifying"), ("verifying", "completed")]


def test_a_repeated_execute_never_runs_twice(runtime: CutoverRuntime) -> None:
    cutover_id = plan(runtime)
    first = flows.execute(runtime, cutover_id=cutover_id, idempotency_key="k1", actor="op")
    count = len(events(runtime))
    again = flows.execute(runtime, cutover_id=cutover_id, idempotency_key="k1", actor="op")
    assert (again.state, again.revision) == (first.state, first.revision)
    assert len(events(runtime)) == count
    with pytest.raises(InvalidTransition):
        flows.execute(runtime, cutover_id=cutover_id, idempotency_key="another", actor="op")


def test_cutting_over_the_last_serving_region_is_refused_and_break_glass_overrides(
    runtime: CutoverRuntime, clock: ManualClock
) -> None:
    flows.execute(runtime, cutover_id=plan(runtime), idempotency_key="eu", actor="op")
    us = plan(runtime, scope=US)
    with pytest.raises(SafetyRuleViolation) as caught:
        flows.execute(runtime, cutover_id=us, idempotency_key="us", actor="op")
    assert [v["rule"] for v in caught.value.violations] == ["assertion.serving_region"]
    assert clusters(runtime)["c-us-a"] == "active"
    with session_scope(runtime.factory) as session:
        assert cutover_service.get_or_raise(session, cutover_id=us).state == "planned"
    assert [e.outcome for e in events(runtime, "cutover.blocked")] == ["blocked"]
    with pytest.raises(BreakGlassNeedsReason):
        flows.execute(runtime, cutover_id=us, idempotency_key="us", actor="admin", break_glass=True)
    done = flows.execute(runtime, cutover_id=us, idempotency_key="us", actor="admin", break_glass=True,
                         break_glass_reason="us is on fire too; fail closed")
    assert done.state == "completed" and done.break_glass
    (glass,) = events(runtime, "cutover.break_glass")
    assert (glass.actor, glass.reason, glass.outcome) == ("admin", "us is on fire too; fail closed", "overridden")
    assert glass.after["overridden"][0]["rule"] == "assertion.serving_region"


def test_a_rolled_back_cutover_no_longer_holds_its_region_out(runtime: CutoverRuntime, clock: ManualClock) -> None:
    eu = plan(runtime)
    flows.execute(runtime, cutover_id=eu, idempotency_key="eu", actor="op")
    flows.rollback(runtime, cutover_id=eu, actor="op", reason="eu recovered")
    done = flows.execute(runtime, cutover_id=plan(runtime, scope=US), idempotency_key="us", actor="op")
    assert done.state == "completed"


def test_a_non_l7_cutover_counts_as_taking_its_scope_out(runtime: CutoverRuntime) -> None:
    """A DNS/anycast cutover leaves the clusters active; the assertion still sees the scope as out."""
    anycast = plan(runtime, tier=RoutingTier.ANYCAST)
    assert flows.execute(runtime, cutover_id=anycast, idempotency_key="a", actor="op").state == "completed"
    with pytest.raises(SafetyRuleViolation):
        flows.execute(runtime, cutover_id=plan(runtime, scope=US), idempotency_key="us", actor="op")
    (step,) = events(runtime, "cutover.step")
    assert step.routing_tier == "anycast"


def test_the_stop_switch_gates_execution_but_not_rollback(runtime: CutoverRuntime, clock: ManualClock) -> None:
    done = flows.execute(runtime, cutover_id=plan(runtime, scope=EU_A), idempotency_key="a", actor="op")
    with session_scope(runtime.factory) as session:
        cutover_service.set_gate(session, stopped=True, reason="incident freeze", actor="admin", clock=clock)
    other = plan(runtime, scope=US)
    with pytest.raises(SafetyRuleViolation) as caught:
        flows.execute(runtime, cutover_id=other, idempotency_key="us", actor="op")
    assert [v["rule"] for v in caught.value.violations] == ["gating.stop_switch"]
    assert flows.rollback(runtime, cutover_id=done.id, actor="op", reason="undo").state == "rolled_back"
    with session_scope(runtime.factory) as session:
        gate = cutover_service.set_gate(session, stopped=False, reason="freeze over", actor="admin", clock=clock)
        assert (gate.stopped, gate.revision) == (False, 2)
    assert flows.execute(runtime, cutover_id=other, idempotency_key="us", actor="op").state == "completed"


def test_cutovers_of_one_scope_wait_the_minimum_interval(runtime: CutoverRuntime, clock: ManualClock) -> None:
    first = plan(runtime, scope=EU_A)
    flows.execute(runtime, cutover_id=first, idempotency_key="1", actor="op")
    flows.rollback(runtime, cutover_id=first, actor="op", reason="back")
    second = plan(runtime, scope=EU_A)
    with pytest.raises(SafetyRuleViolation) as caught:
        flows.execute(runtime, cutover_id=second, idempotency_key="2", actor="op")
    assert caught.value.violations[0]["rule"] == "wait.min_interval"
    assert 0 < caught.value.retry_after_s <= 300
    clock.advance(timedelta(minutes=5, seconds=1))
    assert flows.execute(runtime, cutover_id=second, idempotency_key="2", actor="op").state == "completed"


def test_one_active_cutover_per_scope(runtime: CutoverRuntime, scripted: ScriptedDriver) -> None:
    first = plan(runtime, scope=EU_A, tier=RoutingTier.ANYCAST)
    second = plan(runtime, scope=EU_A)
    scripted.crash_on_apply = "203.0.113.1/32"
    with pytest.raises(SimulatedCrash):
        flows.execute(runtime, cutover_id=first, idempotency_key="1", actor="op")
    with pytest.raises(ScopeBusy):
        flows.execute(runtime, cutover_id=second, idempotency_key="2", actor="op")


def test_a_step_that_does_not_verify_rolls_back_what_was_done(
    runtime: CutoverRuntime, scripted: ScriptedDriver
) -> None:
    scripted.scope_targets["region:eu"] = ["203.0.113.0/24", "198.51.100.0/24"]
    scripted.never_verify.add("198.51.100.0/24")
    done = flows.execute(runtime, cutover_id=plan(runtime, tier=RoutingTier.ANYCAST), idempotency_key="k",
                         actor="op")
    assert done.state == "rolled_back"
    assert "did not verify" in (done.failure or "")
    assert [s.status for s in done.steps] == ["reverted", "reverted"]
    assert scripted.announced == {"203.0.113.0/24": True, "198.51.100.0/24": True}
    assert scripted.applied == [("203.0.113.0/24", False), ("198.51.100.0/24", False),
                                ("198.51.100.0/24", True), ("203.0.113.0/24", True)]
    outcomes = [(e.kind, e.outcome) for e in events(runtime) if e.kind in {"cutover.step", "cutover.rollback_step"}]
    assert outcomes == [("cutover.step", "succeeded"), ("cutover.step", "failed"),
                        ("cutover.rollback_step", "succeeded"), ("cutover.rollback_step", "succeeded")]


def test_rollback_restores_the_recorded_before_states_with_its_own_events(runtime: CutoverRuntime) -> None:
    with session_scope(runtime.factory) as session:
        from controlplane.topology.schemas import ClusterUpdate

        topology.update_cluster(session, name="c-eu-b", change=ClusterUpdate(weight=40, reason="smaller"),
                                actor="test", clock=runtime.clock)
    cutover_id = plan(runtime)
    flows.execute(runtime, cutover_id=cutover_id, idempotency_key="k", actor="op")
    back = flows.rollback(runtime, cutover_id=cutover_id, actor="op2", reason="eu recovered")
    assert back.state == "rolled_back"
    with session_scope(runtime.factory) as session:
        states = {c.name: (c.state, c.weight) for c in topology.list_clusters(session)}
    assert states == {"c-eu-a": ("active", 100), "c-eu-b": ("active", 40), "c-us-a": ("active", 100)}
    reverts = events(runtime, "cutover.rollback_step")
    assert [(e.routing_tier, e.actor, e.reason, e.outcome) for e in reverts] == [
        ("l7", "op2", "eu recovered", "succeeded")] * 2
    assert flows.rollback(runtime, cutover_id=cutover_id, actor="op2", reason="again").revision == back.revision


def test_a_planned_cutover_cannot_be_rolled_back(runtime: CutoverRuntime) -> None:
    with pytest.raises(InvalidTransition):
        flows.rollback(runtime, cutover_id=plan(runtime), actor="op", reason="nothing done")


def test_an_automatic_cutover_names_its_evidence(runtime: CutoverRuntime) -> None:
    evidence = {"probe": "eu-a canary failed 5/5", "at": "2026-01-01T00:00:00Z"}
    cutover_id = plan(runtime, scope=EU_A, mode=CutoverMode.AUTOMATIC, evidence=evidence)
    done = flows.execute(runtime, cutover_id=cutover_id, idempotency_key="auto", actor="controlplane:auto")
    assert (done.mode, done.evidence) == ("automatic", evidence)
    (planned,) = events(runtime, "cutover.plan")
    assert planned.after["evidence"] == evidence


def test_a_crash_mid_step_is_resumed_by_execute_after_the_claim_lapses(
    runtime: CutoverRuntime, scripted: ScriptedDriver, clock: ManualClock
) -> None:
    scripted.scope_targets["region:eu"] = ["203.0.113.0/24", "198.51.100.0/24"]
    cutover_id = plan(runtime, tier=RoutingTier.ANYCAST)
    scripted.crash_on_apply = "198.51.100.0/24"
    with pytest.raises(SimulatedCrash):
        flows.execute(runtime, cutover_id=cutover_id, idempotency_key="k", actor="op")
    with session_scope(runtime.factory) as session:
        left = cutover_service.get_or_raise(session, cutover_id=cutover_id)
        assert left.state == "executing"
        assert [s.status for s in left.steps] == ["verified", "applying"]
        assert left.steps[1].actual_before.announced is True
    # The same key while the dead runner's claim is live: reported, not run.
    assert flows.execute(runtime, cutover_id=cutover_id, idempotency_key="k", actor="op").state == "executing"
    with pytest.raises(CutoverInProgress):
        flows.execute(runtime, cutover_id=cutover_id, idempotency_key="other", actor="op")
    clock.advance(timedelta(minutes=2))
    done = flows.execute(runtime, cutover_id=cutover_id, idempotency_key="k", actor="op")
    assert done.state == "completed"
    assert scripted.applied == [("203.0.113.0/24", False), ("198.51.100.0/24", False)]
    assert len(events(runtime, "cutover.resumed")) == 1
    assert len(events(runtime, "cutover.step")) == 2


def test_a_crash_mid_step_is_undone_by_rollback_after_the_claim_lapses(
    runtime: CutoverRuntime, scripted: ScriptedDriver, clock: ManualClock
) -> None:
    cutover_id = plan(runtime, tier=RoutingTier.ANYCAST)
    scripted.never_verify.add("203.0.113.0/24")  # the write lands, then the process dies before verifying
    scripted.announced["203.0.113.0/24"] = True
    scripted.crash_on_apply = "203.0.113.0/24"
    with pytest.raises(SimulatedCrash):
        flows.execute(runtime, cutover_id=cutover_id, idempotency_key="k", actor="op")
    scripted.never_verify.clear()
    scripted.announced["203.0.113.0/24"] = False  # what the dead runner's write did
    with pytest.raises(CutoverInProgress):
        flows.rollback(runtime, cutover_id=cutover_id, actor="op", reason="abandon")
    clock.advance(timedelta(minutes=2))
    back = flows.rollback(runtime, cutover_id=cutover_id, actor="op", reason="abandon")
    assert back.state == "rolled_back"
    assert scripted.announced["203.0.113.0/24"] is True


def test_a_capacity_plan_below_demand_times_headroom_refuses(runtime: CutoverRuntime) -> None:
    class Plan:
        def capacity_after(self, removed: list[Scope]) -> tuple[float, float] | None:
            return (100.0 if any(s.region == "eu" for s in removed) else 200.0, 90.0)

    runtime.capacity = Plan()
    with pytest.raises(SafetyRuleViolation) as caught:
        flows.execute(runtime, cutover_id=plan(runtime, scope=EU_A), idempotency_key="k", actor="op")
    assert caught.value.violations[0]["rule"] == "assertion.capacity"
    assert "demand 90 × headroom 1.2" in caught.value.violations[0]["message"]


def test_an_instance_is_ejected_and_readmitted_through_the_snapshot(runtime: CutoverRuntime) -> None:
    instance = Scope(ScopeKind.INSTANCE, "eu", "engine-1")
    cutover_id = plan(runtime, scope=instance, generation=3)
    done = flows.execute(runtime, cutover_id=cutover_id, idempotency_key="k", actor="op")
    assert done.state == "completed"
    with session_scope(runtime.factory) as session:
        snapshot = snapshot_service.build(session)
    assert [(e["instance_id"], e["generation"]) for e in snapshot["ejections"]] == [("engine-1", 3)]
    assert flows.rollback(runtime, cutover_id=cutover_id, actor="op", reason="back").state == "rolled_back"
    with session_scope(runtime.factory) as session:
        assert snapshot_service.build(session)["ejections"] == []


def test_a_later_in_cutover_puts_the_scope_back_for_the_assertion(runtime: CutoverRuntime, clock: ManualClock) -> None:
    flows.execute(runtime, cutover_id=plan(runtime), idempotency_key="out", actor="op")
    clock.advance(timedelta(minutes=6))
    back_in = plan(runtime, target=TargetState.IN)
    assert flows.execute(runtime, cutover_id=back_in, idempotency_key="in", actor="op").state == "completed"
    assert clusters(runtime) == {"c-eu-a": "active", "c-eu-b": "active", "c-us-a": "active"}
    assert flows.execute(runtime, cutover_id=plan(runtime, scope=US), idempotency_key="us", actor="op").state == (
        "completed")
