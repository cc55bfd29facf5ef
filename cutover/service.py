"""Cutover records: plan (a dry run that changes no routing), read, the stop switch. Never commits.

Orchestration with side effects on the tiers — execute, verify, roll back —
is in `cutover.flows`, which commits per step so a crash leaves a state
another runner can finish.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session

from common.clock import Clock
from common.logs import get_logger
from controlplane.auth.roles import Role
from controlplane.event import service as event_service
from cutover import repository
from cutover.errors import CutoverNotFound, EvidenceRequired, NothingToCutOver
from cutover.metrics import GATE_CHANGES
from cutover.models import Cutover, CutoverGate, CutoverMode, CutoverStep
from cutover.scope import Scope, ScopeKind, TargetState
from contract.routing_tier import RoutingTier
from cutover.runtime import CutoverRuntime
from cutover.safety import Violation, evaluate
from cutover.states import CutoverState, StepStatus
from cutover.drivers.step import describe_target
from cutover.drivers.recorded_only import RECORDED_ONLY

log = get_logger(__name__)


def record(session: Session, cutover: Cutover, *, kind: str, actor: str, clock: Clock, reason: str | None = None,
           **fields: Any) -> None:
    """One event of `cutover`; an instance scope's carries the generation it acts on in `after.generation`."""
    if cutover.scope_kind == ScopeKind.INSTANCE:
        fields["after"] = {**(fields.get("after") or {}), "generation": cutover.generation}
    event_service.record(
        session, kind=kind, actor=actor, reason=reason if reason is not None else cutover.reason,
        scope=cutover.scope, clock=clock, **fields,
    )


def get_or_raise(session: Session, *, cutover_id: int, fresh: bool = False, lock: bool = False) -> Cutover:
    cutover = repository.get_cutover(session, cutover_id=cutover_id, fresh=fresh, lock=lock)
    if cutover is None:
        raise CutoverNotFound(f"no cutover #{cutover_id}")
    return cutover


def list_cutovers(session: Session, *, state: CutoverState | None = None, scope: str | None = None,
                  limit: int = 100) -> Sequence[Cutover]:
    return repository.list_cutovers(session, state=state.value if state else None, scope_prefix=scope, limit=limit)


def _check_scope(session: Session, scope: Scope) -> None:
    from controlplane.topology import repository as topology
    from controlplane.topology import service as topology_service
    from controlplane.topology.errors import ZoneNotFound

    topology_service.get_region_or_raise(session, name=scope.region)
    if scope.kind == ScopeKind.ZONE and topology.get_zone(session, region=scope.region, name=scope.name) is None:
        raise ZoneNotFound(f"region {scope.region!r} has no zone {scope.name!r}")


def plan(
    session: Session,
    runtime: CutoverRuntime,
    *,
    scope: Scope,
    tiers: Sequence[RoutingTier],
    target_state: TargetState,
    reason: str,
    mode: CutoverMode,
    actor: str,
    evidence: dict[str, Any] | None = None,
    generation: int | None = None,
    step_timeout: timedelta | None = None,
) -> tuple[Cutover, list[Violation]]:
    """Record a planned cutover: every step with the state the tier shows now and the one it would show after.

    Reads each tier (`read_state`) and changes none. The first tier is the
    cutover's tier; more are added in order (a zonal shift: l7, then anycast).
    Returns the safety rules that would refuse it now (re-checked on execute).
    A tier without a driver is refused, or planned as recorded only
    (`runtime.record_unconfigured`; see `recorded_only_tiers`).
    """
    if mode == CutoverMode.AUTOMATIC and not evidence:
        raise EvidenceRequired("an automatic cutover must name the evidence that triggered it")
    _check_scope(session, scope)
    clock = runtime.clock
    planned: list[CutoverStep] = []
    for tier in tiers:
        timeout = (step_timeout or runtime.policy.step_timeout_for(tier)).total_seconds()
        for driver in runtime.planning_drivers(tier):
            for target in driver.targets(scope, generation=generation):
                before = driver.read_state(target)
                after = driver.desired(before, target_state)
                planned.append(CutoverStep(
                    position=len(planned) + 1, tier=tier.value, driver=driver.name,
                    driver_target=describe_target(target), expected_before=before, expected_after=after,
                    timeout_s=timeout, status=StepStatus.PENDING.value,
                ))
    if not planned:
        hint = " (an instance scope at l7 needs its generation)" if scope.kind == ScopeKind.INSTANCE else ""
        raise NothingToCutOver(f"no tier has anything to change for {scope.key}{hint}")
    now = clock.utcnow()
    cutover = Cutover(
        scope_kind=scope.kind.value, region=scope.region, scope_name=scope.name, scope=scope.key,
        tier=tiers[0].value, target_state=target_state.value, reason=reason, mode=mode.value, evidence=evidence,
        generation=generation if scope.kind == ScopeKind.INSTANCE else None, planned_by=actor, state=CutoverState.PLANNED.value, revision=1, break_glass=False,
        created_at=now, updated_at=now, steps=planned,
    )
    session.add(cutover)
    session.flush()
    violations = evaluate(session, cutover=cutover, policy=runtime.policy, clock=clock, capacity=runtime.capacity)
    record(
        session, cutover, kind="cutover.plan", actor=actor, clock=clock,
        after={"cutover_id": cutover.id, "tier": cutover.tier, "target_state": cutover.target_state,
               "mode": cutover.mode, "evidence": evidence, "steps": len(planned),
               "safety": [v.as_json() for v in violations]},
    )
    return cutover, violations


def get_gate(session: Session) -> CutoverGate | None:
    return repository.get_gate(session)


def require_gate_role(role: Role, *, stopped: bool) -> None:
    """Stopping every new cutover is an operator's call; releasing the stop needs an admin (API, console)."""
    from controlplane.errors import Forbidden

    if not stopped and not role.allows(Role.ADMIN):
        raise Forbidden("releasing the cutover stop switch needs an admin token")


def set_gate(
    session: Session, *, stopped: bool, reason: str, actor: str, clock: Clock, expected_revision: int | None = None
) -> CutoverGate:
    """Turn the global stop switch on or off (compare-and-set on its revision), writing an event.

    The caller checks the role first (`require_gate_role`).
    """
    from sqlalchemy import update

    from cutover.errors import CutoverInProgress

    gate = repository.get_gate(session)
    now = clock.utcnow()
    before = {"stopped": gate.stopped, "revision": gate.revision} if gate else {"stopped": False, "revision": 0}
    if expected_revision is not None and expected_revision != before["revision"]:
        raise CutoverInProgress(f"the stop switch is at revision {before['revision']}, not {expected_revision}",
                                type="gate_conflict")
    if gate is None:
        from sqlalchemy.exc import IntegrityError

        gate = CutoverGate(id=1, stopped=stopped, reason=reason, actor=actor, revision=1, changed_at=now)
        try:
            with session.begin_nested():
                session.add(gate)  # two first writers: the primary key decides
        except IntegrityError as exc:
            raise CutoverInProgress("the stop switch changed concurrently; retry", type="gate_conflict") from exc
    else:
        result = session.execute(
            update(CutoverGate).where(CutoverGate.id == 1, CutoverGate.revision == gate.revision)
            .values(stopped=stopped, reason=reason, actor=actor, revision=gate.revision + 1, changed_at=now)
            .execution_options(synchronize_session=False)
        )
        if result.rowcount != 1:
            raise CutoverInProgress("the stop switch changed concurrently; retry", type="gate_conflict")
        gate = repository.get_gate(session) or gate
    event_service.record(
        session, kind="cutover.gate", actor=actor, reason=reason, scope="global", clock=clock,
        before=before, after={"stopped": stopped, "revision": gate.revision},
    )
    GATE_CHANGES.labels(to="stopped" if stopped else "released").inc()
    log.info("cutover_gate_set", stopped=stopped, revision=gate.revision, actor=actor)
    return gate


def recorded_only_tiers(cutover: Cutover) -> list[RoutingTier]:
    """The cutover's tiers that no driver acts at: their steps are recorded and change nothing."""
    return [RoutingTier(t) for t in sorted({s.tier for s in cutover.steps if s.driver == RECORDED_ONLY})]
