"""A zone fault where anycast and mesh cannot act (no anycast driver, no mesh route naming the zone).

The runtime is the served plane's shape — the snapshot's l7 and mesh
built in, a dns tier built from typed driver settings
(`cutover.runtime.build_drivers`) over a real BIND9, and no anycast table — so
the zone's anycast + mesh rung has nothing to change. The ladder skips it
(one `cutover.escalation_skipped` event, no cutover) and drains just that
zone at l7, in the snapshot; the region's record, read back from BIND,
stays where it was. A zone where l7 has nothing to drain either holds
short of the region: a region move needs a region fault. A region fault
moves the record at dns, and the safety rules still hold it (capacity,
the anti-flapping wait).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import dns.message
import dns.query
import pytest
from prometheus_client import REGISTRY

from common.clock import ManualClock, SystemClock
from controlplane.db import session_scope
from controlplane.event import service as event_service
from controlplane.event.repository import EventFilter
from controlplane.topology import repository as topology_repository, service as topology_service
from cutover import flows, service as cutover_service
from cutover.capacity import CapacityConfig
from cutover.drivers_file import CutoverDriversConfig
from cutover.runtime import CutoverRuntime, build_drivers
from cutover.drivers.snapshot_l7 import SnapshotL7Driver
from cutover.drivers.snapshot_mesh import SnapshotMeshDriver
from cutover.escalation import Action, Fault
from cutover.escalation_flow import escalate
from cutover.models import CutoverMode
from cutover.scope import Scope, ScopeKind, TargetState
from contract.routing_tier import RoutingTier
from cutover.policy import CutoverPolicy
from lifeline.daemons import BindServer
from tests.integration.cutover.conftest import REGION_A, REGION_B
from tests.integration.cutover.test_cutover_support import (  # noqa: F401 - fixtures
    policy,
    read_factory,
    topology_two_regions,
)

pytestmark = pytest.mark.usefixtures("topology_two_regions")

EU_A = Scope(ScopeKind.ZONE, "eu", "eu-a")
EU = Scope(ScopeKind.REGION, "eu", "eu")
FAULT = Fault("agent:eu:region:eu:zone:eu-a:1", EU_A, {"source": "agent probe", "zone": "eu-a", "rounds": 3})
REGION_FAULT = Fault("agent:eu:region:eu:1", EU, {"source": "agent probe", "zones_down": ["eu-a", "eu-b"],
                                                   "rounds": 3})
# eu (two warm zones, 300 sequences) and us (one cold zone, 90): all of eu out leaves 110 for 390 × 1.2.
PLANS = """
[[plans]]
region = "eu"
zones = ["eu-a", "eu-b"]
demand_seqs = 300
demand_tokens_per_s = 100
context_tokens = 100
instance_seqs = 10
instance_tokens_per_s = 1000
instance_prefill_tokens_per_s = 10000
[[plans]]
region = "us"
zones = ["us-a"]
tier = "cold"
demand_seqs = 90
demand_tokens_per_s = 100
context_tokens = 100
instance_seqs = 10
instance_tokens_per_s = 1000
instance_prefill_tokens_per_s = 10000
"""


def _runtime(session_factory: Any, read_factory: Any, clock: ManualClock, policy: CutoverPolicy,  # noqa: F811
             dns_drivers: list[Any], **extra: Any) -> CutoverRuntime:
    snapshot = {"read_factory": read_factory, "clock": clock, "sleep": clock.advance, "poll_interval_s": 0.1}
    return CutoverRuntime(factory=session_factory, clock=clock, policy=policy, read_factory=read_factory,
                          drivers=[SnapshotL7Driver(session_factory, **snapshot),
                                   SnapshotMeshDriver(session_factory, **snapshot), *dns_drivers], **extra)


@pytest.fixture
def bind_dns(bind_server: BindServer, tmp_path: Path) -> list[Any]:
    """The dns tier over the lab's BIND9 (eu and us fail over to each other), and no anycast table."""
    (tmp_path / "tsig.secret").write_text(bind_server.key_secret)
    config = CutoverDriversConfig.model_validate({"dns": {
        "zone": bind_server.zone, "name": f"api.{bind_server.zone}",
        "rfc2136": {"server": bind_server.host, "port": bind_server.port, "key_name": bind_server.key_name,
                    "key_secret_file": tmp_path / "tsig.secret"},
        "regions": {"eu": {"answer": [REGION_A], "failover_to": "us"},
                    "us": {"answer": [REGION_B], "failover_to": "eu"}}}})
    drivers = build_drivers(config, clock=SystemClock())
    assert [d.tier for d in drivers] == [RoutingTier.DNS]
    return drivers


def _answer(bind: BindServer) -> list[str]:
    response = dns.query.udp(dns.message.make_query(f"api.{bind.zone}", "A"), bind.host, port=bind.port, timeout=2)
    return sorted(r.address for rrset in response.answer for r in rrset)


def _events(runtime: CutoverRuntime, kind: str) -> list[Any]:
    with session_scope(runtime.factory) as session:
        return sorted(event_service.list_events(session, EventFilter(kind=kind), limit=100), key=lambda e: e.id)


def _cutovers(runtime: CutoverRuntime) -> list[Any]:
    with session_scope(runtime.factory) as session:
        return sorted(cutover_service.list_cutovers(session), key=lambda c: c.id)


def test_a_zone_anycast_and_mesh_cannot_act_on_is_drained_at_l7_and_the_region_record_stays(
        session_factory: Any, read_factory: Any, clock: ManualClock, policy: CutoverPolicy,  # noqa: F811
        bind_dns: list[Any], bind_server: BindServer) -> None:
    runtime = _runtime(session_factory, read_factory, clock, policy, bind_dns)
    skips = {"action": "skipped", "fault_scope": "zone", "tier": "mesh"}
    skipped_before = REGISTRY.get_sample_value("lifeline_cutover_escalation_decisions_total", skips) or 0.0
    decisions = escalate(runtime, FAULT, actor="token:agent-eu#5")
    assert [d.action for d in decisions] == [Action.SKIPPED, Action.CUT_OVER, Action.CONTAINED]
    assert REGISTRY.get_sample_value("lifeline_cutover_escalation_decisions_total", skips) == skipped_before + 1
    assert (decisions[0].tiers, decisions[0].scope) == ((RoutingTier.MESH,), EU_A)
    assert (decisions[1].tiers, decisions[1].scope) == ((RoutingTier.L7,), EU_A)
    assert _answer(bind_server) == [REGION_A]  # read back from the authoritative server: the region did not move

    (l7_cutover,) = _cutovers(runtime)  # the skipped rung made no cutover
    assert (l7_cutover.tier, l7_cutover.scope, l7_cutover.mode, l7_cutover.state) == (
        "l7", "region:eu/zone:eu-a", "automatic", "completed")
    escalated = l7_cutover.evidence["escalated_from"]
    assert (escalated["cutover_id"], escalated["tier"], escalated["scope"], escalated["outcome"]) == (
        None, "mesh", "region:eu/zone:eu-a", "nothing_to_change")
    assert l7_cutover.evidence["fault"]["id"] == FAULT.id
    with session_scope(runtime.factory) as session:
        clusters = {c.name: c.state for c in topology_repository.list_clusters(session, model=None, region="eu")}
    assert clusters == {"c-eu-a": "draining", "c-eu-b": "active"}  # just the zone

    # One event per step of the ladder, each with its routing tier.
    (skip,) = _events(runtime, "cutover.escalation_skipped")
    assert (skip.routing_tier, skip.outcome, skip.scope, skip.after["tiers"]) == (
        "mesh", "skipped", "region:eu/zone:eu-a", ["mesh"])
    (step,) = _events(runtime, "cutover.step")
    assert (step.routing_tier, step.outcome, step.after["state"]["state"]) == ("l7", "succeeded", "draining")
    (stop,) = _events(runtime, "cutover.escalation")
    assert (stop.routing_tier, stop.outcome) == ("l7", "succeeded")
    assert [(a["tier"], a["outcome"]) for a in stop.after["attempts"]] == [
        ("mesh", "nothing_to_change"), ("l7", "verified")]

    # The same fault again resumes its ladder from the records: contained, no second skip or cutover.
    again = escalate(runtime, FAULT, actor="token:agent-eu#5")
    assert [d.action for d in again] == [Action.CONTAINED]
    assert len(_cutovers(runtime)) == 1 and len(_events(runtime, "cutover.escalation_skipped")) == 1


def test_a_zone_no_zone_tier_can_act_on_holds_and_never_moves_the_region(
        session_factory: Any, read_factory: Any, clock: ManualClock, policy: CutoverPolicy,  # noqa: F811
        bind_dns: list[Any], bind_server: BindServer) -> None:
    with session_scope(session_factory) as session:  # a zone with no cluster: l7 has nothing to drain there
        topology_service.create_zone(session, region="eu", name="eu-c", actor="test", clock=clock)
    runtime = _runtime(session_factory, read_factory, clock, policy, bind_dns)
    fault = Fault("agent:eu:region:eu:zone:eu-c:1", Scope(ScopeKind.ZONE, "eu", "eu-c"), {"source": "agent probe"})
    decisions = escalate(runtime, fault, actor="agent")
    assert [(d.action, d.tiers) for d in decisions] == [
        (Action.SKIPPED, (RoutingTier.MESH,)), (Action.SKIPPED, (RoutingTier.L7,)), (Action.HOLD, ())]
    assert "a region move needs the evidence of a region fault" in decisions[2].reason
    assert _answer(bind_server) == [REGION_A]
    assert _cutovers(runtime) == []
    (stop,) = _events(runtime, "cutover.escalation")
    assert (stop.outcome, stop.after["action"], [a["outcome"] for a in stop.after["attempts"]]) == (
        "blocked", "hold", ["nothing_to_change", "nothing_to_change"])


def test_a_region_fault_moves_the_real_dns_record(
        session_factory: Any, read_factory: Any, clock: ManualClock, policy: CutoverPolicy,  # noqa: F811
        bind_dns: list[Any], bind_server: BindServer) -> None:
    runtime = _runtime(session_factory, read_factory, clock, policy, bind_dns)
    decisions = escalate(runtime, REGION_FAULT, actor="token:agent-eu#5")
    assert [(d.action, d.tiers) for d in decisions] == [(Action.CUT_OVER, (RoutingTier.DNS,)), (Action.CONTAINED, ())]
    assert _answer(bind_server) == [REGION_B]
    (dns_cutover,) = _cutovers(runtime)
    assert (dns_cutover.tier, dns_cutover.scope, dns_cutover.mode, dns_cutover.state) == (
        "dns", "region:eu", "automatic", "completed")
    (step,) = _events(runtime, "cutover.step")
    assert (step.routing_tier, step.outcome, step.after["state"]["values"]) == ("dns", "succeeded", [REGION_B])


def test_a_region_fault_is_refused_by_the_capacity_rule_and_changes_nothing(
        session_factory: Any, read_factory: Any, clock: ManualClock, policy: CutoverPolicy,  # noqa: F811
        bind_dns: list[Any], bind_server: BindServer) -> None:
    capacity = CapacityConfig.model_validate(tomllib.loads(PLANS)).build()
    runtime = _runtime(session_factory, read_factory, clock, policy, bind_dns, capacity=capacity)
    decisions = escalate(runtime, REGION_FAULT, actor="agent")
    assert [d.action for d in decisions] == [Action.CUT_OVER, Action.HOLD]
    assert _answer(bind_server) == [REGION_A]
    (dns_cutover,) = _cutovers(runtime)
    assert (dns_cutover.tier, dns_cutover.state) == ("dns", "planned")
    (blocked,) = _events(runtime, "cutover.blocked")
    assert [v["rule"] for v in blocked.after["violations"]] == ["assertion.capacity"]
    (stop,) = _events(runtime, "cutover.escalation")
    assert (stop.outcome, stop.after["action"]) == ("blocked", "hold")


def test_a_region_fault_waits_out_the_regions_last_cutover(
        session_factory: Any, read_factory: Any, clock: ManualClock, policy: CutoverPolicy,  # noqa: F811
        bind_dns: list[Any], bind_server: BindServer) -> None:
    runtime = _runtime(session_factory, read_factory, clock, policy, bind_dns)
    with session_scope(runtime.factory) as session:  # an operator moved eu's record and moved it back just now
        manual, _ = cutover_service.plan(session, runtime, scope=EU, tiers=[RoutingTier.DNS],
                                         target_state=TargetState.OUT, reason="eu drill", mode=CutoverMode.MANUAL,
                                         actor="op")
    flows.execute(runtime, cutover_id=manual.id, idempotency_key="k", actor="op")
    flows.rollback(runtime, cutover_id=manual.id, actor="op", reason="drill over")
    assert _answer(bind_server) == [REGION_A]
    decisions = escalate(runtime, REGION_FAULT, actor="agent")
    assert [d.action for d in decisions] == [Action.CUT_OVER, Action.HOLD]
    assert _answer(bind_server) == [REGION_A]
    (_, automatic) = _cutovers(runtime)
    assert (automatic.tier, automatic.mode, automatic.state) == ("dns", "automatic", "planned")
    (blocked,) = _events(runtime, "cutover.blocked")
    assert [v["rule"] for v in blocked.after["violations"]] == ["wait.min_interval"]
