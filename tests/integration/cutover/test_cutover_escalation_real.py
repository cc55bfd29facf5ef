"""Automatic escalation on the real drivers: a zone fault withdraws the zone at BIRD; when that cannot verify, l7
drains just that zone and the region's DNS record, read back from a real BIND9, stays where it was.

The runtime's anycast and dns drivers are built from typed driver settings
(`cutover.runtime.build_drivers`, as the served control plane builds them) over a
real BIRD 2 observing two ExaBGP speakers and a real BIND9.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import dns.message
import dns.query
import pytest

from common.clock import ManualClock, SystemClock
from controlplane.db import session_scope
from controlplane.event import service as event_service
from controlplane.event.repository import EventFilter
from cutover import service as cutover_service
from cutover.drivers_file import CutoverDriversConfig
from cutover.runtime import CutoverRuntime, build_drivers
from cutover.escalation import Action, Fault
from cutover.escalation_flow import escalate
from cutover.drivers.snapshot_l7 import SnapshotL7Driver
from cutover.scope import Scope, ScopeKind
from lifeline.daemons import BindServer
from tests.integration.cutover.conftest import REGION_A, REGION_B, AnycastLab
from tests.integration.cutover.test_cutover_support import (  # noqa: F401 - fixtures
    policy,
    read_factory,
    topology_two_regions,
)

pytestmark = pytest.mark.usefixtures("topology_two_regions")

EU_A = Scope(ScopeKind.ZONE, "eu", "eu-a")
LAB_ZONE = {"eu-a": "zone-a", "eu-b": "zone-b"}


@pytest.fixture
def real_runtime(session_factory: Any, read_factory: Any, clock: ManualClock, policy: Any,  # noqa: F811
                 anycast_lab: AnycastLab, bind_server: BindServer, tmp_path: Path) -> CutoverRuntime:
    (tmp_path / "tsig.secret").write_text(bind_server.key_secret)
    config = CutoverDriversConfig.model_validate({
        "anycast": {"prefix": anycast_lab.targets["zone-a"].prefix, "birdc_socket": anycast_lab.router.socket_path,
                    "ack_timeout_s": 0.3,
                    "zones": [{"region": "eu", "zone": zone, "next_hop": anycast_lab.targets[lab].next_hop,
                               "command_fifo": anycast_lab.speakers[lab].command_fifo,
                               "ack_fifo": anycast_lab.speakers[lab].ack_fifo} for zone, lab in LAB_ZONE.items()]},
        "dns": {"zone": bind_server.zone, "name": f"api.{bind_server.zone}",
                "rfc2136": {"server": bind_server.host, "port": bind_server.port, "key_name": bind_server.key_name,
                            "key_secret_file": tmp_path / "tsig.secret"},
                "regions": {"eu": {"answer": [REGION_A], "failover_to": "us"},
                            "us": {"answer": [REGION_B], "failover_to": "eu"}}},
    })
    l7 = SnapshotL7Driver(session_factory, read_factory=read_factory, clock=clock, sleep=clock.advance,
                          poll_interval_s=0.1)
    return CutoverRuntime(factory=session_factory, clock=clock, policy=policy, read_factory=read_factory,
                          drivers=[l7, *build_drivers(config, clock=SystemClock())])


def _answer(bind: BindServer) -> list[str]:
    response = dns.query.udp(dns.message.make_query(f"api.{bind.zone}", "A"), bind.host, port=bind.port, timeout=2)
    return sorted(r.address for rrset in response.answer for r in rrset)


def _announced(lab: AnycastLab, zone: str) -> bool:
    return lab.driver.read_state(lab.targets[zone]).announced


def _cutovers(runtime: CutoverRuntime) -> list[Any]:
    with session_scope(runtime.factory) as session:
        found = cutover_service.list_cutovers(session)
        return sorted(((c.id, c.tier, c.scope, c.mode, c.state, c.evidence) for c in found), key=lambda c: c[0])


FAULT = Fault("probe:eu-a:1", EU_A, {"source": "agent probe", "zone": "eu-a", "failed_probes": 5})


def test_zone_fault_withdraws_the_zone_at_real_bird_and_stops_there(
        real_runtime: CutoverRuntime, anycast_lab: AnycastLab, bind_server: BindServer) -> None:
    decisions = escalate(real_runtime, FAULT, actor="controlplane:escalation")
    assert [d.action for d in decisions] == [Action.CUT_OVER, Action.CONTAINED]
    assert not _announced(anycast_lab, "zone-a") and _announced(anycast_lab, "zone-b")
    assert _answer(bind_server) == [REGION_A]  # dns untouched: the lower tier verified
    ((_, tier, scope, mode, state, evidence),) = _cutovers(real_runtime)
    assert (tier, scope, mode, state) == ("anycast", "region:eu/zone:eu-a", "automatic", "completed")
    assert evidence["fault"]["failed_probes"] == 5 and "escalated_from" not in evidence


def test_zone_fault_whose_withdrawal_cannot_verify_is_drained_at_l7_and_dns_stays(
        real_runtime: CutoverRuntime, anycast_lab: AnycastLab, bind_server: BindServer) -> None:
    speaker = anycast_lab.speakers["zone-a"]
    assert speaker.process is not None
    os.kill(speaker.process.pid, signal.SIGSTOP)  # zone-a's ExaBGP hangs: its withdrawal is never acknowledged
    try:
        decisions = escalate(real_runtime, FAULT, actor="controlplane:escalation")
    finally:
        os.kill(speaker.process.pid, signal.SIGCONT)
    assert [d.action for d in decisions] == [Action.CUT_OVER, Action.CUT_OVER, Action.CONTAINED]
    assert _answer(bind_server) == [REGION_A]  # the region's record did not move for one zone
    (anycast, l7_cutover) = _cutovers(real_runtime)
    assert (anycast[1], anycast[4]) == ("anycast", "failed")  # neither the withdrawal nor its revert verified
    assert (l7_cutover[1], l7_cutover[2], l7_cutover[3], l7_cutover[4]) == (
        "l7", "region:eu/zone:eu-a", "automatic", "completed")
    escalated = l7_cutover[5]["escalated_from"]
    assert (escalated["cutover_id"], escalated["tier"], escalated["outcome"]) == (
        anycast[0], "anycast", "verification_failed")
    assert l7_cutover[5]["fault"]["id"] == FAULT.id
    # The step's own evidence says why the lower tier failed: the speaker never acknowledged.
    with session_scope(real_runtime.factory) as session:
        step = cutover_service.get_or_raise(session, cutover_id=anycast[0]).steps[0]
        assert step.outcome == "failed" and step.evidence["error"] == "cutover_driver_unavailable"
    # Where the ladder stopped, and on what, is one event.
    with session_scope(real_runtime.factory) as session:
        (stop,) = event_service.list_events(session, EventFilter(kind="cutover.escalation"), limit=10)
        assert (stop.routing_tier, stop.outcome, stop.scope) == ("l7", "succeeded", "region:eu/zone:eu-a")
        assert [a["outcome"] for a in stop.after["attempts"]] == ["verification_failed", "verified"]


def test_a_second_fault_for_a_zone_already_withdrawn_holds_until_the_first_is_rolled_back(
        real_runtime: CutoverRuntime, anycast_lab: AnycastLab, clock: ManualClock) -> None:
    from cutover import flows

    assert [d.action for d in escalate(real_runtime, FAULT, actor="agent")] == [Action.CUT_OVER, Action.CONTAINED]
    ((first_id, *_),) = _cutovers(real_runtime)
    # another detector (an agent replica, a restarted agent) reports the same outage under its own id
    other = Fault("probe:eu-a:replica-2", EU_A, {"source": "agent replica", "zone": "eu-a"})
    [held] = escalate(real_runtime, other, actor="agent")
    assert held.action == Action.HOLD and f"cutover #{first_id}" in held.reason
    assert len(_cutovers(real_runtime)) == 1 and not _announced(anycast_lab, "zone-a")
    with session_scope(real_runtime.factory) as session:
        stops = event_service.list_events(session, EventFilter(kind="cutover.escalation"), limit=10)
        assert sorted(e.outcome for e in stops) == ["blocked", "succeeded"]

    flows.rollback(real_runtime, cutover_id=first_id, actor="operator", reason="eu-a is back")
    assert _announced(anycast_lab, "zone-a")
    clock.advance(real_runtime.policy.min_wait.total_seconds() + 1)  # past the anti-flapping wait
    returned = Fault("probe:eu-a:3", EU_A, {"source": "agent probe", "zone": "eu-a"})
    assert [d.action for d in escalate(real_runtime, returned, actor="agent")] == [Action.CUT_OVER, Action.CONTAINED]
    assert len(_cutovers(real_runtime)) == 2 and not _announced(anycast_lab, "zone-a")
