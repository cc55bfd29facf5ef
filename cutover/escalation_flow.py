"""The escalation ladder against the cutover records: what each rung left, and acting on the next decision.

    attempts_for(fault)   the rungs tried for a fault: its automatic cutovers (found by
                          `fault.id` in their evidence, each with `outcome_of`) and the
                          skips their `escalated_from` names
    escalate(fault)       decide → plan + execute the cutover (or skip a rung with nothing
                          to change) → decide again, until a decision is not a cutover;
                          one `cutover.escalation_skipped` event per skip, one
                          `cutover.escalation` event where the ladder stops

The decision itself is `cutover.escalation.decide`, pure and table-tested;
this module adds what only the records and the runtime know: who already
holds a scope out, and which tiers have a driver.

    lifeline_cutover_escalation_decisions_total{action,fault_scope,tier}
"""

from __future__ import annotations

from collections.abc import Sequence

from common.logs import get_logger
from controlplane.db import session_scope
from cutover import flows, service as cutover_service
from cutover.errors import NothingToCutOver, SafetyRuleViolation
from cutover.escalation import RUNGS, Action, Attempt, Decision, Fault, Outcome, decide, fault_evidence
from cutover.metrics import ESCALATION_DECISIONS
from cutover.models import Cutover, CutoverMode
from cutover.scope import Scope, ScopeKind, TargetState
from contract.routing_tier import RoutingTier
from cutover.runtime import CutoverRuntime
from cutover.states import ACTIVE_STATES, CutoverState
from cutover.drivers.recorded_only import RECORDED_ONLY

log = get_logger(__name__)


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
    """The rungs tried for this fault, oldest first: its automatic cutovers, and the skips they name."""
    attempts: list[Attempt] = []
    with session_scope(runtime.reads) as session:
        for c in cutover_service.list_cutovers(session, scope=f"region:{fault.scope.region}", limit=1000):
            evidence = c.evidence or {}
            if c.mode != CutoverMode.AUTOMATIC or (evidence.get("fault") or {}).get("id") != fault.id:
                continue
            rung = int(evidence.get("rung", 0))
            attempts.append(Attempt(c.id, rung, RoutingTier(c.tier),
                                    Scope(ScopeKind(c.scope_kind), c.region, c.scope_name), outcome_of(c), c.failure))
            skipped = evidence.get("escalated_from") or {}
            if skipped.get("outcome") == Outcome.NOTHING_TO_CHANGE:  # the rung below: a skip, no record of its own
                kind, _, name = str(skipped["scope"]).rpartition("/")[2].partition(":")
                attempts.append(Attempt(None, rung - 1, RoutingTier(skipped["tier"]),
                                        Scope(ScopeKind(kind), c.region, name), Outcome.NOTHING_TO_CHANGE,
                                        skipped.get("failure")))
    return sorted(attempts, key=lambda a: (a.rung, a.cutover_id or 0))


def already_out(runtime: CutoverRuntime, scope: Scope, tiers: Sequence[RoutingTier]) -> Cutover | None:
    """A cutover that holds `scope` out at one of `tiers` now (running or completed), whoever made it."""
    held = ACTIVE_STATES | {CutoverState.COMPLETED}
    with session_scope(runtime.reads) as session:
        found = cutover_service.list_cutovers(session, scope=scope.key, limit=1000)
        return next((c for c in found if c.scope == scope.key and CutoverState(c.state) in held
                     and c.target_state == TargetState.OUT and RoutingTier(c.tier) in tiers), None)


def escalate(runtime: CutoverRuntime, fault: Fault, *, actor: str, max_steps: int = len(RUNGS) + 1) -> list[Decision]:
    """Act on `fault` until a decision is not a cutover; returns every decision taken, in order.

    The first rung that acts, for a new fault, holds if its scope is already held out at its tiers (another
    detector's fault, an agent replica's, an operator's cutover): one outage, one cutover. A rung whose tiers
    have nothing to change is skipped (a `cutover.escalation_skipped` event) and the next one decided; a skip
    to a rung no driver is configured for holds: nothing there can act either.
    """
    decisions: list[Decision] = []
    skipped: list[Attempt] = []
    for _ in range(max_steps):
        recorded = attempts_for(runtime, fault)
        attempts = sorted([*recorded, *(a for a in skipped if a.rung not in {r.rung for r in recorded})],
                          key=lambda a: (a.rung, a.cutover_id or 0))
        decision = _checked(runtime, decide(fault, attempts), attempts)
        decisions.append(decision)
        if decision.action != Action.CUT_OVER:
            _count(fault, decision)
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
            _count(fault, decision)
        except NothingToCutOver as exc:
            skip = Attempt(None, decision.rung, tiers[0], decision.scope, Outcome.NOTHING_TO_CHANGE, exc.message)
            skipped.append(skip)
            decisions[-1] = Decision(Action.SKIPPED, f"{'+'.join(t.value for t in tiers)} has nothing to change "
                                                     f"for {decision.scope.key}: {exc.message}",
                                     decision.rung, tuple(tiers), decision.scope)
            _count(fault, decisions[-1])
            _record_skip(runtime, fault, decisions[-1], actor=actor)
            continue
        try:
            flows.execute(runtime, cutover_id=cutover_id, idempotency_key=f"escalation:{fault.id}:{decision.rung}",
                          actor=actor)
        except SafetyRuleViolation:
            pass  # recorded as blocked; the next decide() sees a refused attempt and holds
    return decisions


def _checked(runtime: CutoverRuntime, decision: Decision, attempts: Sequence[Attempt]) -> Decision:
    """`decide`'s cut-over, held where the runtime says it cannot or must not act (decide knows no records)."""
    if decision.action != Action.CUT_OVER or decision.scope is None:
        return decision
    if not any(a.cutover_id is not None for a in attempts):  # the first rung that acts for this fault
        holder = already_out(runtime, decision.scope, decision.tiers)
        if holder is not None:
            return Decision(Action.HOLD, f"cutover #{holder.id} ({holder.tier}, {holder.mode}) already holds "
                                         f"{decision.scope.key} out: {holder.reason}"[:2000])
    last = max(attempts, key=lambda a: a.rung) if attempts else None
    if last is not None and last.outcome == Outcome.NOTHING_TO_CHANGE \
            and not any(runtime.drivers_for(t) for t in decision.tiers):
        names = "+".join(t.value for t in decision.tiers)
        return Decision(Action.HOLD, f"{decision.reason}, but no {names} driver is configured: nothing can act on "
                                     f"{decision.scope.key}; a person must act at that tier")
    return decision


def _count(fault: Fault, decision: Decision) -> None:
    tier = decision.tiers[0].value if decision.tiers else "none"
    ESCALATION_DECISIONS.labels(action=decision.action.value, fault_scope=fault.scope.kind.value, tier=tier).inc()
    log.info("cutover_escalation_decision", fault_id=fault.id, action=decision.action.value, rung=decision.rung,
             tier=tier, scope=decision.scope.key if decision.scope else None, reason=decision.reason)


def _generation(fault: Fault) -> dict[str, int | None]:
    """`after.generation` of an instance fault's events, as every instance-scope cutover event carries it."""
    return {"generation": fault.generation} if fault.scope.kind == ScopeKind.INSTANCE else {}


def _record_skip(runtime: CutoverRuntime, fault: Fault, decision: Decision, *, actor: str) -> None:
    """One `cutover.escalation_skipped` event per skipped rung: the log says why the ladder went past it."""
    from controlplane.event import service as event_service

    assert decision.scope is not None and decision.rung is not None
    with session_scope(runtime.factory) as session:
        event_service.record(
            session, kind="cutover.escalation_skipped", actor=actor, reason=decision.reason, scope=fault.scope.key,
            clock=runtime.clock, routing_tier=decision.tiers[0], outcome="skipped",
            after={"action": decision.action.value, "rung": decision.rung, "scope": decision.scope.key,
                   "tiers": [t.value for t in decision.tiers], **fault_evidence(fault), **_generation(fault)})


def _record_stop(runtime: CutoverRuntime, fault: Fault, decision: Decision, attempts: Sequence[Attempt], *,
                 actor: str) -> None:
    """One `cutover.escalation` event when the ladder stops, so the log says why it went no higher."""
    from controlplane.event import service as event_service

    last = max(attempts, key=lambda a: a.rung) if attempts else None
    with session_scope(runtime.factory) as session:
        event_service.record(
            session, kind="cutover.escalation", actor=actor, reason=decision.reason, scope=fault.scope.key,
            clock=runtime.clock, routing_tier=last.tier if last else None,
            outcome={Action.CONTAINED: "succeeded", Action.HOLD: "blocked"}.get(decision.action, "failed"),
            after={"action": decision.action.value, **fault_evidence(fault), **_generation(fault),
                   "attempts": [{"cutover_id": a.cutover_id, "tier": a.tier.value, "scope": a.scope.key,
                                 "outcome": a.outcome.value} for a in attempts]})
