"""Cutover and zonal-shift routes under /api/v1. Thin: parse, call the service or flow, shape.

    POST   /cutovers                    plan (a dry run: steps with expected before/after)   operator
    GET    /cutovers[/{id}]                                                                   viewer
    POST   /cutovers/{id}/execute       run it (idempotency_key; break_glass needs admin)     operator
    POST   /cutovers/{id}/rollback      restore the recorded before-states                    operator
    POST   /cutovers/{id}/abort         stop a running one at its next step boundary, roll back  operator
    GET    /cutover-gate                the global stop switch                                viewer
    PUT    /cutover-gate                stop: operator; release: admin
    POST   /zonal-shifts                start (expires_in ≤ 72 h)                              operator
    GET    /zonal-shifts[/{id}]                                                               viewer
    DELETE /zonal-shifts/{id}?reason=   cancel (reverts now)                                  operator
    POST   /cutover-escalations         a fault: automatic cutovers up the tier ladder        operator, agent

The mesh tier's routes (/mesh-routes) are controlplane/mesh_route/endpoints.py's.

Execute and rollback run in the request's worker thread until the cutover
is completed, rolled back or failed (each step bounded by its timeout);
they open their own units of work, one per step, and do not use the
request's session. The events of a cutover: GET /api/v1/events?scope=…
or ?routing_tier=….
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from controlplane.auth.dependencies import EscalationReporter, Operator, Viewer
from controlplane.auth.roles import Role
from controlplane.db import DbSession, session_scope
from controlplane.deps import IdPath
from controlplane.types import Reason
from cutover import flows, zonal_shift
from cutover import service as cutover_service
from cutover.errors import BreakGlassNeedsAdmin
from cutover.scope import Scope
from cutover.runtime import CutoverRuntime
from cutover.schemas import (
    CutoverPlanRequest,
    CutoverRead,
    DecisionRead,
    EscalationRead,
    EscalationRequest,
    ExecuteRequest,
    GateRead,
    GateUpdate,
    PlanRead,
    RollbackRequest,
    ZonalShiftRead,
    ZonalShiftStart,
)
from cutover.states import CutoverState
from cutover.zonal_shift import ExpiryLoop

router = APIRouter(tags=["cutover"])


def runtime_for(state: Any) -> CutoverRuntime:
    """The app's one runtime (`app.state.cutover_runtime`), built by `create_app` (`cutover.runtime.build_runtime`)."""
    return state.cutover_runtime


def _runtime(request: Request) -> CutoverRuntime:
    return runtime_for(request.app.state)


def start_expiry_loop(state: Any) -> ExpiryLoop:
    """For the control plane's lifespan: end due zonal shifts every `policy.expiry_interval`; `.stop()` on shutdown."""
    loop = ExpiryLoop(lambda: runtime_for(state), interval=runtime_for(state).policy.expiry_interval)
    loop.start()
    return loop


def _shift_read(shift: object) -> ZonalShiftRead:
    read = ZonalShiftRead.model_validate(shift)
    read.active = read.ended_at is None
    return read


@router.post("/cutovers", status_code=201, response_model=PlanRead)
def plan_cutover(body: CutoverPlanRequest, request: Request, session: DbSession, principal: Operator) -> PlanRead:
    """Plan a cutover: every step with the state its tier shows now and the one it would show after. Changes no routing."""
    runtime = _runtime(request)
    scope = Scope(body.scope.kind, body.scope.region, body.scope.name or body.scope.region)
    cutover, violations = cutover_service.plan(
        session, runtime, scope=scope, tiers=[body.tier], target_state=body.target_state, reason=body.reason,
        mode=body.mode, actor=principal.actor, evidence=body.evidence, generation=body.generation,
        step_timeout=timedelta(seconds=body.step_timeout_s) if body.step_timeout_s else None,
    )
    return PlanRead.model_validate(cutover).model_copy(update={
        "safety": [v.as_json() for v in violations], "recorded_only": cutover_service.recorded_only_tiers(cutover)})


@router.get("/cutovers", response_model=list[CutoverRead])
def list_cutovers(
    session: DbSession,
    _: Viewer,
    state: CutoverState | None = None,
    scope: Annotated[str | None, Query(max_length=400, pattern=r"^[^\x00]*$", description="scope prefix")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[CutoverRead]:
    return [CutoverRead.model_validate(c)
            for c in cutover_service.list_cutovers(session, state=state, scope=scope, limit=limit)]


@router.get("/cutovers/{cutover_id}", response_model=CutoverRead)
def get_cutover(cutover_id: IdPath, session: DbSession, _: Viewer) -> CutoverRead:
    return CutoverRead.model_validate(cutover_service.get_or_raise(session, cutover_id=cutover_id))


@router.post("/cutovers/{cutover_id}/execute", response_model=CutoverRead)
def execute_cutover(cutover_id: IdPath, body: ExecuteRequest, request: Request, principal: Operator) -> CutoverRead:
    """Run the cutover; the same idempotency_key again returns it without running twice.

    200 with `state` completed, rolled_back (a step did not verify; see
    `failure` and the steps' evidence) or failed. 409 safety_rule_violation,
    scope_busy, cutover_in_progress, invalid_transition.
    """
    if body.break_glass and not principal.role.allows(Role.ADMIN):
        raise BreakGlassNeedsAdmin("break-glass overrides safety rules and needs an admin token")
    done = flows.execute(
        _runtime(request), cutover_id=cutover_id, idempotency_key=body.idempotency_key, actor=principal.actor,
        break_glass=body.break_glass, break_glass_reason=body.break_glass_reason,
    )
    return CutoverRead.model_validate(done)


@router.post("/cutovers/{cutover_id}/rollback", response_model=CutoverRead)
def rollback_cutover(cutover_id: IdPath, body: RollbackRequest, request: Request, principal: Operator) -> CutoverRead:
    """Restore every touched step's recorded before-state (also completes one a crash interrupted)."""
    done = flows.rollback(_runtime(request), cutover_id=cutover_id, actor=principal.actor, reason=body.reason)
    return CutoverRead.model_validate(done)


@router.post("/cutovers/{cutover_id}/abort", status_code=202, response_model=CutoverRead)
def abort_cutover(cutover_id: IdPath, body: RollbackRequest, request: Request, principal: Operator) -> CutoverRead:
    """Ask the runner to stop at its next step boundary and roll back (202: it is still running when this answers).

    A cutover whose runner is gone is rolled back at once; 409 for one that is planned or finished.
    """
    done = flows.abort(_runtime(request), cutover_id=cutover_id, actor=principal.actor, reason=body.reason)
    return CutoverRead.model_validate(done)


def _gate_read(gate: object | None) -> GateRead:
    if gate is None:
        return GateRead(stopped=False, reason="", actor=None, revision=0, changed_at=None)
    return GateRead(stopped=gate.stopped, reason=gate.reason, actor=gate.actor,  # type: ignore[attr-defined]
                    revision=gate.revision, changed_at=gate.changed_at)  # type: ignore[attr-defined]


@router.get("/cutover-gate", response_model=GateRead)
def get_gate(session: DbSession, _: Viewer) -> GateRead:
    return _gate_read(cutover_service.get_gate(session))


@router.put("/cutover-gate", response_model=GateRead)
def set_gate(body: GateUpdate, request: Request, session: DbSession, principal: Operator) -> GateRead:
    """Stop every new cutover (operator) or release the stop (admin). Rollbacks and expiries are never stopped."""
    cutover_service.require_gate_role(principal.role, stopped=body.stopped)
    gate = cutover_service.set_gate(session, stopped=body.stopped, reason=body.reason, actor=principal.actor,
                                    clock=request.app.state.clock, expected_revision=body.expected_revision)
    return _gate_read(gate)


@router.post("/zonal-shifts", status_code=201, response_model=ZonalShiftRead)
def start_zonal_shift(body: ZonalShiftStart, request: Request, principal: Operator) -> ZonalShiftRead:
    shift = zonal_shift.start(_runtime(request), region=body.region, zone=body.zone,
                              expires_in=body.expires_in, reason=body.reason, actor=principal.actor)
    return _shift_read(shift)


@router.get("/zonal-shifts", response_model=list[ZonalShiftRead])
def list_zonal_shifts(session: DbSession, _: Viewer, active: bool = False) -> list[ZonalShiftRead]:
    return [_shift_read(s) for s in zonal_shift.list_shifts(session, active_only=active)]


@router.get("/zonal-shifts/{shift_id}", response_model=ZonalShiftRead)
def get_zonal_shift(shift_id: IdPath, session: DbSession, _: Viewer) -> ZonalShiftRead:
    return _shift_read(zonal_shift.get_or_raise(session, shift_id=shift_id))


@router.delete("/zonal-shifts/{shift_id}", response_model=ZonalShiftRead)
def cancel_zonal_shift(
    shift_id: IdPath, request: Request, principal: Operator,
    reason: Annotated[Reason, Query(min_length=1, max_length=2000)],
) -> ZonalShiftRead:
    """End the shift now: its cutover is rolled back and the zone returns."""
    return _shift_read(zonal_shift.cancel(_runtime(request), shift_id=shift_id, actor=principal.actor,
                                          reason=reason))



@router.post("/cutover-escalations", response_model=EscalationRead)
def escalate_fault(body: EscalationRequest, request: Request, principal: EscalationReporter) -> EscalationRead:
    """Act on a fault at the smallest scope first: l7 for an instance; anycast + mesh, then l7's drain, for a zone;
    dns for a region. Up one rung only when the lower one's verification failed or it had nothing to change, and
    never to dns for an instance or zone fault: a region move needs a region fault (cutover/escalation.py). Each
    cutover is automatic and names the evidence."""
    from cutover.escalation import Fault
    from cutover.escalation_flow import attempts_for, escalate

    runtime = _runtime(request)
    fault = Fault(body.fault_id, Scope(body.scope.kind, body.scope.region, body.scope.name or body.scope.region),
                  body.evidence, zone=body.zone, generation=body.generation)
    decisions = escalate(runtime, fault, actor=principal.actor)
    with session_scope(runtime.reads) as session:
        cutovers = [CutoverRead.model_validate(cutover_service.get_or_raise(session, cutover_id=a.cutover_id))
                    for a in attempts_for(runtime, fault) if a.cutover_id is not None]
    return EscalationRead(decisions=[DecisionRead(action=d.action.value, reason=d.reason, rung=d.rung,
                                                  tiers=list(d.tiers), scope=d.scope.key if d.scope else None,
                                                  evidence=d.evidence) for d in decisions], cutovers=cutovers)
