"""Every event of an instance-scope cutover names the generation it acted on, on SQLite and PostgreSQL.

An endpoint is `(instance_id, generation)` (ARCHITECTURE invariant 1): a
post-mortem reading "engine-7 was ejected" must be able to tell which
incarnation. Before, only the snapshot step's target string carried the
generation; the plan, transition, HAProxy step and escalation events did not.
"""

from __future__ import annotations

from typing import Any

import pytest

from common.clock import ManualClock
from controlplane.db import session_scope
from controlplane.event import service as event_service
from controlplane.event.repository import EventFilter
from cutover import flows, service as cutover_service
from cutover.escalation import Action, Fault
from cutover.escalation_flow import escalate
from cutover.drivers.snapshot_l7 import SnapshotL7Driver
from cutover.models import CutoverMode
from cutover.scope import Scope, ScopeKind, TargetState
from contract.routing_tier import RoutingTier
from cutover.policy import CutoverPolicy
from cutover.runtime import CutoverRuntime
from tests.integration.cutover.test_cutover_support import (  # noqa: F401 - fixtures
    ScriptedDriver,
    policy,
    read_factory,
    topology_two_regions,
)

pytestmark = pytest.mark.usefixtures("topology_two_regions")

ENGINE = Scope(ScopeKind.INSTANCE, "eu", "engine-7")


@pytest.fixture
def runtime(session_factory: Any, read_factory: Any, clock: ManualClock,  # noqa: F811
            policy: CutoverPolicy) -> CutoverRuntime:  # noqa: F811
    snapshot = SnapshotL7Driver(session_factory, read_factory=read_factory, clock=clock, sleep=clock.advance,
                                poll_interval_s=0.1)
    haproxy = ScriptedDriver(RoutingTier.L7, "haproxy", targets={ENGINE.key: ["be/engine-7"]})
    return CutoverRuntime(factory=session_factory, clock=clock, policy=policy, read_factory=read_factory,
                          drivers=[snapshot, haproxy])


def instance_events(runtime: CutoverRuntime) -> list[Any]:
    with session_scope(runtime.reads) as session:
        found = event_service.list_events(session, EventFilter(), limit=1000)
        return [e for e in found if e.scope == ENGINE.key and e.kind.startswith("cutover.")]


def test_every_event_of_an_instance_cutover_names_its_generation(runtime: CutoverRuntime) -> None:
    with session_scope(runtime.factory) as session:
        cutover, _ = cutover_service.plan(session, runtime, scope=ENGINE, tiers=[RoutingTier.L7],
                                          target_state=TargetState.OUT, reason="outlier", mode=CutoverMode.MANUAL,
                                          actor="op", generation=3)
        cutover_id = cutover.id
        assert cutover.generation == 3
    done = flows.execute(runtime, cutover_id=cutover_id, idempotency_key="k", actor="op")
    assert done.state == "completed"
    flows.rollback(runtime, cutover_id=cutover_id, actor="op", reason="back")
    events = instance_events(runtime)
    kinds = {e.kind for e in events}
    assert {"cutover.plan", "cutover.transition", "cutover.step", "cutover.rollback_step"} <= kinds, kinds
    assert [(e.kind, (e.after or {}).get("generation")) for e in events
            if (e.after or {}).get("generation") != 3] == []
    haproxy_steps = [e for e in events if e.kind == "cutover.step" and e.after["driver"] == "haproxy"]
    assert haproxy_steps and "@3" not in haproxy_steps[0].after["target"]  # its target cannot say; the event does


def test_a_zone_cutover_has_no_generation_to_name(runtime: CutoverRuntime) -> None:
    with session_scope(runtime.factory) as session:
        cutover, _ = cutover_service.plan(session, runtime, scope=Scope(ScopeKind.ZONE, "eu", "eu-a"),
                                          tiers=[RoutingTier.L7], target_state=TargetState.OUT, reason="zone",
                                          mode=CutoverMode.MANUAL, actor="op", generation=3)
        assert cutover.generation is None
    with session_scope(runtime.reads) as session:
        (plan,) = event_service.list_events(session, EventFilter(kind="cutover.plan"), limit=10)
    assert "generation" not in plan.after


def test_an_instance_faults_escalation_events_name_the_generation_it_judged(runtime: CutoverRuntime) -> None:
    fault = Fault("outlier:engine-7:3", ENGINE, {"source": "gateway outlier detection"}, zone="eu-a", generation=3)
    decisions = escalate(runtime, fault, actor="op")
    assert [d.action for d in decisions] == [Action.CUT_OVER, Action.CONTAINED]
    with session_scope(runtime.reads) as session:
        (stop,) = event_service.list_events(session, EventFilter(kind="cutover.escalation"), limit=10)
        (cutover,) = cutover_service.list_cutovers(session)
        assert (cutover.generation, cutover.evidence["fault"]["generation"]) == (3, 3)
    assert stop.after["fault"]["generation"] == 3
    assert all((e.after or {}).get("generation") == 3 for e in instance_events(runtime))
