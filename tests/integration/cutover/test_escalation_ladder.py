"""The whole ladder in one report: an instance fault whose l7 and zone rungs all fail to verify holds short of dns.

The region moves only for a region fault: a second report, of the region itself, takes dns.

Scripted tiers (in-memory stand-ins for HAProxy, ExaBGP and BIND9, whose
real drivers are tested in test_cutover_escalation_real.py) so that each
rung's verification can be made to fail on purpose.
"""

from __future__ import annotations

from typing import Any

import pytest

from common.clock import ManualClock
from contract.routing_tier import RoutingTier
from controlplane.db import session_scope
from controlplane.event import service as event_service
from controlplane.event.repository import EventFilter
from cutover import service as cutover_service
from cutover.escalation import Action, Fault
from cutover.escalation_flow import escalate
from cutover.scope import Scope, ScopeKind
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
EU = Scope(ScopeKind.REGION, "eu", "eu")


def test_an_instance_fault_climbs_to_its_zone_holds_short_of_the_region_and_a_region_fault_moves_it(
        session_factory: Any, read_factory: Any, clock: ManualClock, policy: CutoverPolicy) -> None:  # noqa: F811
    l7 = ScriptedDriver(RoutingTier.L7, "haproxy", targets={ENGINE.key: ["be/engine-7"],
                                                            "region:eu/zone:eu-a": ["be/zone-eu-a"]})
    anycast = ScriptedDriver(RoutingTier.ANYCAST, "exabgp", targets={"region:eu/zone:eu-a": ["203.0.113.10/32"]})
    dns = ScriptedDriver(RoutingTier.DNS, "rfc2136", targets={"region:eu": ["api.lifeline.test."]})
    l7.never_verify |= {"be/engine-7", "be/zone-eu-a"}
    anycast.never_verify.add("203.0.113.10/32")
    runtime = CutoverRuntime(factory=session_factory, clock=clock, policy=policy, read_factory=read_factory,
                             drivers=[l7, anycast, dns])
    fault = Fault("outlier:engine-7:1", ENGINE, {"source": "outlier detection"}, zone="eu-a")
    decisions = escalate(runtime, fault, actor="op")
    assert [d.action for d in decisions] == [Action.CUT_OVER, Action.CUT_OVER, Action.CUT_OVER, Action.HOLD]
    assert [(d.tiers[0], d.scope.key) for d in decisions[:3]] == [  # type: ignore[union-attr]
        (RoutingTier.L7, ENGINE.key), (RoutingTier.ANYCAST, "region:eu/zone:eu-a"),
        (RoutingTier.L7, "region:eu/zone:eu-a")]
    assert "a region move needs the evidence of a region fault" in decisions[3].reason
    assert dns.announced == {} and dns.applied == []  # the region was never touched for an instance fault
    with session_scope(runtime.factory) as session:
        states = [(c.tier, c.state) for c in sorted(cutover_service.list_cutovers(session), key=lambda c: c.id)]
        (stop,) = event_service.list_events(session, EventFilter(kind="cutover.escalation"), limit=10)
    assert states == [("l7", "rolled_back"), ("anycast", "rolled_back"), ("l7", "rolled_back")]
    assert (stop.routing_tier, stop.outcome, stop.after["action"]) == ("l7", "blocked", "hold")

    region = Fault("agent:eu:region:eu:1", EU, {"source": "agent probe", "zones_down": ["eu-a", "eu-b"]})
    decisions = escalate(runtime, region, actor="op")
    assert [(d.action, d.tiers) for d in decisions] == [(Action.CUT_OVER, (RoutingTier.DNS,)), (Action.CONTAINED, ())]
    assert dns.announced == {"api.lifeline.test.": False}
