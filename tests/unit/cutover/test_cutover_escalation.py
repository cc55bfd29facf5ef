"""Automatic escalation's pure decision: which tier acts on a fault, and when the next one up takes over."""

from __future__ import annotations

import pytest

from contract.routing_tier import RoutingTier as T
from cutover.errors import EvidenceRequired
from cutover.escalation import Action, Attempt, Fault, Outcome, decide
from cutover.scope import Scope, ScopeKind

ENGINE = Scope(ScopeKind.INSTANCE, "eu", "engine-7")
EU_A = Scope(ScopeKind.ZONE, "eu", "eu-a")
EU = Scope(ScopeKind.REGION, "eu", "eu")
SEEN = {"source": "probe", "failures": 3, "last_error": "connect timeout"}


def _attempt(rung: int, tier: T, scope: Scope, outcome: Outcome, cutover_id: int = 1,
             failure: str | None = None) -> Attempt:
    return Attempt(cutover_id, rung, tier, scope, outcome, failure)


def _skip(rung: int, tier: T, scope: Scope) -> Attempt:
    """A rung whose tiers had nothing to change for the scope: no cutover was made."""
    return Attempt(None, rung, tier, scope, Outcome.NOTHING_TO_CHANGE,
                   f"no tier has anything to change for {scope.key}")


@pytest.mark.parametrize(("fault", "attempts", "action", "tiers", "scope", "from_cutover"), [
    pytest.param(Fault("f", ENGINE, SEEN, zone="eu-a"), [], Action.CUT_OVER, (T.L7,), ENGINE, None,
                 id="instance-fault-starts-at-l7"),
    pytest.param(Fault("f", EU_A, SEEN), [], Action.CUT_OVER, (T.ANYCAST, T.MESH), EU_A, None,
                 id="zone-fault-starts-at-anycast-and-mesh"),
    pytest.param(Fault("f", EU, SEEN), [], Action.CUT_OVER, (T.DNS,), EU, None,
                 id="region-fault-exceeds-every-zone-tier-starts-at-dns"),
    pytest.param(Fault("f", ENGINE, SEEN, zone="eu-a"), [_attempt(0, T.L7, ENGINE, Outcome.VERIFIED)],
                 Action.CONTAINED, (), None, None, id="l7-verified-contained"),
    pytest.param(Fault("f", ENGINE, SEEN, zone="eu-a"),
                 [_attempt(0, T.L7, ENGINE, Outcome.VERIFICATION_FAILED, 4, "step 1 did not verify")],
                 Action.CUT_OVER, (T.ANYCAST, T.MESH), EU_A, 4, id="l7-failed-escalates-to-the-instances-zone"),
    pytest.param(Fault("f", ENGINE, SEEN), [_attempt(0, T.L7, ENGINE, Outcome.VERIFICATION_FAILED)],
                 Action.HOLD, (), None, None, id="l7-failed-without-a-known-zone-holds"),
    pytest.param(Fault("f", EU_A, SEEN), [_attempt(1, T.ANYCAST, EU_A, Outcome.VERIFICATION_FAILED, 9)],
                 Action.CUT_OVER, (T.L7,), EU_A, 9, id="anycast-failed-drains-the-zone-at-l7-not-the-region"),
    pytest.param(Fault("f", EU_A, SEEN), [_attempt(1, T.ANYCAST, EU_A, Outcome.REFUSED, failure="capacity")],
                 Action.HOLD, (), None, None, id="a-refused-attempt-is-not-escalated-past"),
    pytest.param(Fault("f", EU_A, SEEN), [_attempt(1, T.ANYCAST, EU_A, Outcome.IN_PROGRESS)],
                 Action.HOLD, (), None, None, id="a-running-attempt-holds"),
    pytest.param(Fault("f", EU, SEEN), [_attempt(3, T.DNS, EU, Outcome.VERIFICATION_FAILED)],
                 Action.EXHAUSTED, (), None, None, id="dns-failed-nothing-left"),
    pytest.param(Fault("f", EU, SEEN), [_attempt(3, T.DNS, EU, Outcome.RECORDED_ONLY)],
                 Action.HOLD, (), None, None, id="a-recorded-only-attempt-changed-nothing-so-contains-nothing"),
    pytest.param(Fault("f", ENGINE, SEEN, zone="eu-a"),
                 [_attempt(0, T.L7, ENGINE, Outcome.VERIFICATION_FAILED, 1),
                  _attempt(1, T.ANYCAST, EU_A, Outcome.VERIFICATION_FAILED, 2)],
                 Action.CUT_OVER, (T.L7,), EU_A, 2, id="instance-fault-climbs-to-its-zones-l7-drain"),
    pytest.param(Fault("f", ENGINE, SEEN, zone="eu-a"),
                 [_attempt(0, T.L7, ENGINE, Outcome.VERIFICATION_FAILED, 1),
                  _attempt(1, T.ANYCAST, EU_A, Outcome.VERIFICATION_FAILED, 2),
                  _attempt(2, T.L7, EU_A, Outcome.VERIFICATION_FAILED, 3)],
                 Action.HOLD, (), None, None, id="instance-fault-never-moves-the-region"),
    pytest.param(Fault("f", ENGINE, SEEN, zone="eu-a"),
                 [_attempt(0, T.L7, ENGINE, Outcome.VERIFICATION_FAILED, 1),
                  _attempt(1, T.ANYCAST, EU_A, Outcome.VERIFIED, 2)],
                 Action.CONTAINED, (), None, None, id="the-highest-rung-decides"),
    pytest.param(Fault("f", EU_A, SEEN), [_skip(1, T.MESH, EU_A)],
                 Action.CUT_OVER, (T.L7,), EU_A, None, id="zone-with-nothing-to-change-at-anycast-and-mesh-drains-at-l7"),
    pytest.param(Fault("f", EU_A, SEEN), [_skip(1, T.MESH, EU_A), _attempt(2, T.L7, EU_A, Outcome.VERIFIED, 5)],
                 Action.CONTAINED, (), None, None, id="the-zones-l7-drain-contains-it"),
    pytest.param(Fault("f", EU_A, SEEN), [_skip(1, T.MESH, EU_A),
                                          _attempt(2, T.L7, EU_A, Outcome.VERIFICATION_FAILED, 5)],
                 Action.HOLD, (), None, None, id="a-zone-fault-its-zone-tiers-cannot-contain-holds-short-of-dns"),
    pytest.param(Fault("f", EU_A, SEEN), [_skip(1, T.MESH, EU_A), _skip(2, T.L7, EU_A)],
                 Action.HOLD, (), None, None, id="a-zone-nothing-can-change-holds-short-of-dns"),
    pytest.param(Fault("f", ENGINE, SEEN, zone="eu-a"),
                 [_attempt(0, T.L7, ENGINE, Outcome.VERIFICATION_FAILED, 3), _skip(1, T.ANYCAST, EU_A)],
                 Action.CUT_OVER, (T.L7,), EU_A, None, id="instance-fault-skips-to-its-zones-l7-drain"),
    pytest.param(Fault("f", ENGINE, SEEN, zone="eu-a"), [_skip(0, T.L7, ENGINE)],
                 Action.HOLD, (), None, None, id="an-instance-l7-cannot-act-on-never-widens-to-its-zone"),
    pytest.param(Fault("f", EU, SEEN), [_skip(3, T.DNS, EU)],
                 Action.EXHAUSTED, (), None, None, id="dns-with-nothing-to-change-nothing-left"),
    pytest.param(Fault("f", EU_A, SEEN), [_skip(1, T.MESH, EU_A), _attempt(2, T.L7, EU_A, Outcome.REFUSED, 6)],
                 Action.HOLD, (), None, None, id="the-l7-drain-after-a-skip-is-held-by-a-safety-rule"),
])
def test_decide(fault: Fault, attempts: list[Attempt], action: Action, tiers: tuple[T, ...], scope: Scope | None,
                from_cutover: int | None) -> None:
    decision = decide(fault, attempts)
    assert (decision.action, decision.tiers, decision.scope) == (action, tiers, scope)
    if action == Action.CUT_OVER:
        named = {"generation": fault.generation} if fault.scope.kind == ScopeKind.INSTANCE else {}
        assert decision.evidence["fault"] == {"id": "f", "scope": fault.scope.key, **named, **SEEN}  # what it saw
        escalated = decision.evidence.get("escalated_from")
        assert (escalated or {}).get("cutover_id") == from_cutover
        if escalated:
            below = max(attempts, key=lambda a: a.rung)
            assert (escalated["outcome"], escalated["tier"], escalated["scope"]) == (
                below.outcome.value, below.tier.value, below.scope.key)
    else:
        assert decision.evidence == {}


def test_an_automatic_action_needs_evidence() -> None:
    with pytest.raises(EvidenceRequired):
        decide(Fault("f", EU, {}), [])


def test_a_recorded_only_attempt_says_a_person_must_act_at_that_tier() -> None:
    decision = decide(Fault("f", EU, SEEN), [_attempt(3, T.DNS, EU, Outcome.RECORDED_ONLY, 5)])
    assert "no dns driver is configured" in decision.reason and "a person must act" in decision.reason


def test_a_skip_says_what_had_nothing_to_change_and_where_the_ladder_goes() -> None:
    decision = decide(Fault("f", EU_A, SEEN), [_skip(1, T.MESH, EU_A)])
    assert decision.reason == "mesh for region:eu/zone:eu-a had nothing to change: escalating to l7"
    assert decision.evidence["escalated_from"]["failure"] == "no tier has anything to change for region:eu/zone:eu-a"


@pytest.mark.parametrize("outcome", [Outcome.VERIFICATION_FAILED, Outcome.NOTHING_TO_CHANGE])
def test_a_zone_fault_the_zone_tiers_cannot_contain_says_a_region_move_needs_a_region_fault(outcome: Outcome) -> None:
    decision = decide(Fault("f", EU_A, SEEN), [_skip(1, T.MESH, EU_A), _attempt(2, T.L7, EU_A, outcome, 5)])
    assert decision.action == Action.HOLD
    assert "a region move needs the evidence of a region fault" in decision.reason
    assert "report region:eu itself" in decision.reason


def test_an_instance_faults_evidence_names_the_generation_it_judged() -> None:
    decision = decide(Fault("f", ENGINE, SEEN, zone="eu-a", generation=7), [])
    assert decision.evidence["fault"]["generation"] == 7
    assert "generation" not in decide(Fault("f", EU_A, SEEN), []).evidence["fault"]  # a zone has no incarnation
