"""The whole ladder in one report: an instance fault whose l7 and zone rungs both fail to verify ends at dns.

Scripted tiers (in-memory stand-ins for HAProxy, ExaBGP and BIND9, whose
real drivers are tested in test_cutover_escalation_real.py) so that each
rung's verification can be made to fail on purpose.
"""

from __future__ import annotations

from typing import Any

import pytest

from common.clock import ManualClock
from controlplane.db import session_scope
from controlplane.event import service as event_service
from controlplane.event.repository import EventFilter
from cutover import service as cutover_service
from cutover.escalation import Action, Fault
from cutover.escalation_flow import escalate
from cutover.models import CutoverTier, ScopeKind
from cutover.policy import CutoverPolicy
from cutover.service import CutoverRuntime
from cutover.tiers import Scope
from tests.integration.cutover.test_cutover_support import (  # noqa: F401 - fixtures
    ScriptedDriver,
    policy,
    read_factory,
    topology_two_regions,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("topology_two_regions")]

ENGINE = Scope(ScopeKind.INSTANCE, "eu", "engine-7")


def test_an_instance_fault_climbs_every_rung_and_the_ladder_says_where_it_stopped(
        session_factory: Any, read_factory: Any, clock: ManualClock, policy: CutoverPolicy) -> None:  # noqa: F811
    l7 = ScriptedDriver(CutoverTier.L7, "haproxy", targets={ENGINE.key: ["be/engine-7"]})
    anycast = ScriptedDriver(CutoverTier.ANYCAST, "exabgp", targets={"region:eu/zone:eu-a": ["203.0.113.10/32"]})
    dns = ScriptedDriver(CutoverTier.DNS, "rfc2136", targets={"region:eu": ["api.lifeline.test."]})
    l7.never_verify.add("be/engine-7")
    anycast.never_verify.add("203.0.113.10/32")
    runtime = CutoverRuntime(factory=session_factory, clock=clock, policy=policy, read_factory=read_factory,
                             drivers=[l7, anycast, dns])
    fault = Fault("outlier:engine-7:1", ENGINE, {"source": "outlier detection"}, zone="eu-a")
    decisions = escalate(runtime, fault, actor="op")
    assert [d.action for d in decisions] == [Action.CUT_OVER, Action.CUT_OVER, Action.CUT_OVER, Action.CONTAINED]
    assert [d.tiers[0] for d in decisions[:3]] == [CutoverTier.L7, CutoverTier.ANYCAST, CutoverTier.DNS]
    assert dns.announced == {"api.lifeline.test.": False}
    with session_scope(runtime.factory) as session:
        states = [(c.tier, c.state) for c in sorted(cutover_service.list_cutovers(session), key=lambda c: c.id)]
        (stop,) = event_service.list_events(session, EventFilter(kind="cutover.escalation"), limit=10)
    assert [s for _, s in states[:2]] == ["rolled_back", "rolled_back"] and states[2] == ("dns", "completed")
    assert (stop.routing_tier, stop.outcome) == ("dns", "succeeded")
