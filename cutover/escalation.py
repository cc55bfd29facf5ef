"""Automatic escalation: which tier acts on a fault, and when the next one up takes over.

    fault scope   first tier                      why it starts there
    instance      l7 (the instance)               the fastest tier that covers it
    zone          anycast + mesh (the zone)       l7 acts per instance: scope exceeded
    region        dns (the region)                l7, mesh, anycast act per zone or less: scope exceeded

An attempt escalates one rung — instance → its zone at anycast + mesh →
its region at dns — **only when its verification failed** (a step did
not verify, or no longer showed its after-state: the cutover rolled
back or failed with that failure). An attempt that a safety rule refused,
that had nothing to change, or that is still running holds the ladder
where it is: a larger blast radius would not be safer than what the rule
or the operator decided. So does one at a tier with no driver configured
(recorded only, in the served control plane): it "verified" without
changing anything, so it contains nothing, and the hold says a person
must act there. After dns there is no rung left.

`decide(fault, attempts)` is pure (table-tested); `escalate(runtime,
fault, actor)` runs it against the cutover records: it plans and executes
each automatic cutover it decides on — `mode=automatic`, with evidence
that names the fault (its source and observations) and, for an
escalation, the attempt whose verification failed (cutover id, tier,
scope, failure) — and stops at the first decision that is not a cutover.
An automatic cutover without evidence is refused (`EvidenceRequired`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from controlplane.db import session_scope
from cutover import flows
from cutover import service as cutover_service
from cutover.errors import EvidenceRequired, NothingToCutOver, SafetyRuleViolation
from cutover.models import Cutover, CutoverMode, CutoverTier, ScopeKind, TargetState
from cutover.service import CutoverRuntime
from cutover.states import ACTIVE_STATES, CutoverState
from cutover.tiers import RECORDED_ONLY, Scope, event_tier


class Outcome(StrEnum):
    VERIFIED = "verified"
    VERIFICATION_FAILED = "verification_failed"
    REFUSED = "refused"  # a safety rule, or nothing to change at that tier
    IN_PROGRESS = "in_progress"
    RECORDED_ONLY = "recorded_only"  # completed, but no driver is configured there: nothing was changed


class Action(StrEnum):
    CUT_OVER = "cut_over"
    CONTAINED = "contained"  # an attempt verified: nothing more to do
    HOLD = "hold"  # an attempt was refused or is running: do not escalate past it
    EXHAUSTED = "exhausted"  # dns did not verify either: no tier left


@dataclass(frozen=True)
class Fault:
    """What a detector (probe, canary, agent report, operator) saw; `id` ties the attempts together."""

    id: str
    scope: Scope
    evidence: Mapping[str, Any]
    zone: str | None = None  # an instance fault: the instance's zone, to escalate to
    generation: int | None = None  # an instance fault: the endpoint generation l7 ejects through the snapshot


@dataclass(frozen=True)
class Attempt:
    """One automatic cutover made for the fault, as its record shows it."""

    cutover_id: int | None
    rung: int
    tier: CutoverTier
    scope: Scope
    outcome: Outcome
    failure: str | None = None


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    rung: int | None = None
    tiers: tuple[CutoverTier, ...] = ()
    scope: Scope | None = None
    evidence: dict[str, Any] = field(default_factory=dict)


# rung → the tiers that act there, in order (the first is the cutover's tier)
RUNGS: tuple[tuple[CutoverTier, ...], ...] = (
    (CutoverTier.L7,), (CutoverTier.ANYCAST, CutoverTier.MESH), (CutoverTier.DNS,))
FIRST_RUNG = {ScopeKind.INSTANCE: 0, ScopeKind.ZONE: 1, ScopeKind.REGION: 2}
_SCOPE_OF_RUNG = (ScopeKind.INSTANCE, ScopeKind.ZONE, ScopeKind.REGION)
_EXCEEDED = {
    ScopeKind.INSTANCE: "the fastest tier that covers one instance",
    ScopeKind.ZONE: "a zone fault exceeds l7's scope (it acts per instance)",
    ScopeKind.REGION: "a region fault exceeds l7's, mesh's and anycast's scope (they act per zone or less)",
}


def _scope_at(fault: Fault, rung: int) -> Scope | None:
    kind = _SCOPE_OF_RUNG[rung]
    if kind == fault.scope.kind:
        return fault.scope
    if kind == ScopeKind.ZONE:
        return Scope(ScopeKind.ZONE, fault.scope.region, fault.zone) if fault.zone else None
    return Scope(ScopeKind.REGION, fault.scope.region, fault.scope.region)


def _fault_evidence(fault: Fault) -> dict[str, Any]:
    return {"fault": {"id": fault.id, "scope": fault.scope.key, **dict(fault.evidence)}}


def decide(fault: Fault, attempts: Sequence[Attempt]) -> Decision:
    """The next step for `fault` given the automatic cutovers already made for it (oldest first)."""
    if not fault.evidence:
        raise EvidenceRequired("an automatic cutover must name the evidence that triggered it")
    if not attempts:
        rung = FIRST_RUNG[fault.scope.kind]
        return Decision(Action.CUT_OVER, f"{fault.scope.kind.value} fault: {_EXCEEDED[fault.scope.kind]}",
                        rung, RUNGS[rung], fault.scope, _fault_evidence(fault))
    last = max(attempts, key=lambda a: a.rung)
    described = f"cutover #{last.cutover_id} ({last.tier.value}, {last.scope.key})"
    if last.outcome == Outcome.VERIFIED:
        return Decision(Action.CONTAINED, f"{described} verified")
    if last.outcome == Outcome.IN_PROGRESS:
        return Decision(Action.HOLD, f"{described} is still running")
    if last.outcome == Outcome.REFUSED:
        return Decision(Action.HOLD, f"{described} was refused ({last.failure}); not escalating past a refusal")
    if last.outcome == Outcome.RECORDED_ONLY:
        return Decision(Action.HOLD, f"{described} changed nothing: no {last.tier.value} driver is configured "
                                     "(recorded only); a person must act at that tier")
    rung = last.rung + 1
    if rung >= len(RUNGS):
        return Decision(Action.EXHAUSTED, f"{described} did not verify and no tier is left above dns")
    scope = _scope_at(fault, rung)
    if scope is None:
        return Decision(Action.HOLD, f"{described} did not verify, and the fault does not name the zone to escalate to")
    evidence = {**_fault_evidence(fault), "escalated_from": {
        "cutover_id": last.cutover_id, "tier": last.tier.value, "scope": last.scope.key,
        "outcome": last.outcome.value, "failure": last.failure}}
    return Decision(Action.CUT_OVER, f"{described} did not verify: escalating to {RUNGS[rung][0].value}",
                    rung, RUNGS[rung], scope, evidence)


# ---------------------------------------------------------------- against the records


_FINAL_VERIFY_FAILED = "no longer shows its after-state"  # flows._final_verify's failure


def outcome_of(cutover: Cutover) -> Outcome:
    """Verification failed: a step's own check failed (its outcome), or the final re-read found one undone."""
    state = CutoverState(cutover.state)
    if state == CutoverState.COMPLETED:
        if cutover.steps and all(step.driver == RECORDED_ONLY for step in cutover.steps):
            return Outcome.RECORDED_ONLY  # "verified" at once, by a tier that changed nothing
        return Outcome.VERIFIED
    if state in ACTIVE_STATES:
        return Outcome.IN_PROGRESS
    if state in (CutoverState.ROLLED_BACK, CutoverState.FAILED) and (
            any(step.outcome == "failed" for step in cutover.steps)
            or _FINAL_VERIFY_FAILED in (cutover.failure or "")):
        return Outcome.VERIFICATION_FAILED
    return Outcome.REFUSED  # planned (blocked by a rule), or rolled back because a rule refused a step


def attempts_for(runtime: CutoverRuntime, fault: Fault) -> list[Attempt]:
    """The automatic cutovers whose evidence names this fault, oldest first."""
    with session_scope(runtime.reads) as session:
        found = cutover_service.list_cutovers(session, scope=f"region:{fault.scope.region}", limit=1000)
        return sorted((
            Attempt(c.id, int((c.evidence or {}).get("rung", 0)), CutoverTier(c.tier),
                    Scope(ScopeKind(c.scope_kind), c.region, c.scope_name), outcome_of(c), c.failure)
            for c in found
            if c.mode == CutoverMode.AUTOMATIC and ((c.evidence or {}).get("fault") or {}).get("id") == fault.id),
            key=lambda a: (a.rung, a.cutover_id or 0))


def already_out(runtime: CutoverRuntime, scope: Scope, tiers: Sequence[CutoverTier]) -> Cutover | None:
    """A cutover that holds `scope` out at one of `tiers` now (running or completed), whoever made it."""
    held = ACTIVE_STATES | {CutoverState.COMPLETED}
    with session_scope(runtime.reads) as session:
        found = cutover_service.list_cutovers(session, scope=scope.key, limit=1000)
        return next((c for c in found if c.scope == scope.key and CutoverState(c.state) in held
                     and c.target_state == TargetState.OUT and CutoverTier(c.tier) in tiers), None)


def escalate(runtime: CutoverRuntime, fault: Fault, *, actor: str, max_steps: int = len(RUNGS)) -> list[Decision]:
    """Act on `fault` until a decision is not a cutover; returns every decision taken, in order.

    A new fault whose first rung's scope is already held out at that rung's tiers (another detector's
    fault, an agent replica's, an operator's cutover) holds: one outage, one cutover.
    """
    decisions: list[Decision] = []
    for _ in range(max_steps):
        attempts = attempts_for(runtime, fault)
        decision = decide(fault, attempts)
        if not attempts and decision.action == Action.CUT_OVER and decision.scope is not None:
            holder = already_out(runtime, decision.scope, decision.tiers)
            if holder is not None:
                decision = Decision(Action.HOLD, f"cutover #{holder.id} ({holder.tier}, {holder.mode}) already holds "
                                                 f"{decision.scope.key} out: {holder.reason}"[:2000])
        decisions.append(decision)
        if decision.action != Action.CUT_OVER:
            _record_stop(runtime, fault, decision, attempts, actor=actor)
            return decisions
        assert decision.scope is not None and decision.rung is not None  # set for every CUT_OVER
        tiers = [t for t in decision.tiers if runtime.drivers_for(t)] or list(decision.tiers[:1])
        evidence = {**decision.evidence, "rung": decision.rung, "decision": decision.reason}
        try:
            with session_scope(runtime.factory) as session:
                cutover, _ = cutover_service.plan(
                    session, runtime, scope=decision.scope, tiers=tiers, target_state=TargetState.OUT,
                    reason=f"automatic: {decision.reason}", mode=CutoverMode.AUTOMATIC, actor=actor,
                    evidence=evidence,
                    generation=fault.generation if decision.scope.kind == ScopeKind.INSTANCE else None)
                cutover_id = cutover.id
        except NothingToCutOver as exc:
            held = Decision(Action.HOLD, f"{tiers[0].value} has nothing to change for {decision.scope.key}: "
                                         f"{exc.message}")
            decisions.append(held)
            _record_stop(runtime, fault, held, attempts, actor=actor)
            return decisions
        try:
            flows.execute(runtime, cutover_id=cutover_id, idempotency_key=f"escalation:{fault.id}:{decision.rung}",
                          actor=actor)
        except SafetyRuleViolation:
            pass  # recorded as blocked; the next decide() sees a refused attempt and holds
    return decisions


def _record_stop(runtime: CutoverRuntime, fault: Fault, decision: Decision, attempts: Sequence[Attempt], *,
                 actor: str) -> None:
    """One `cutover.escalation` event when the ladder stops, so the log says why it went no higher."""
    from controlplane.event import service as event_service

    last = max(attempts, key=lambda a: a.rung) if attempts else None
    with session_scope(runtime.factory) as session:
        event_service.record(
            session, kind="cutover.escalation", actor=actor, reason=decision.reason, scope=fault.scope.key,
            clock=runtime.clock, routing_tier=event_tier(last.tier) if last else None,
            outcome={Action.CONTAINED: "succeeded", Action.HOLD: "blocked"}.get(decision.action, "failed"),
            after={"action": decision.action.value, **_fault_evidence(fault),
                   "attempts": [{"cutover_id": a.cutover_id, "tier": a.tier.value, "scope": a.scope.key,
                                 "outcome": a.outcome.value} for a in attempts]})
