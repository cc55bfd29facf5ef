"""Cutovers and zonal shifts: list, detail, and plan → execute → roll back, start/cancel a shift.

Every action is a call into cutover's own layer — `cutover.service.plan`,
`cutover.flows.execute` / `rollback`, `cutover.zonal_shift.start` /
`cancel` — on the app's one `CutoverRuntime` (`cutover.endpoints.runtime_for`),
so the console and the REST API share drivers, policy, claims and events.
Execute, roll back, start and cancel each sit behind a confirmation page
that shows the steps' expected effect and the safety rules as they stand
now (re-checked by the flow itself when it runs). Operator role;
break-glass on execute needs admin, checked here exactly as the REST route
checks it. Aborting a running cutover and the stop switch are in
`controlplane.console.cutover_controls`, on `cutover_page` and `page_user`
from here.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from controlplane.auth.roles import Role
from controlplane.console.session import ConsoleUser
from controlplane.console.web import (
    Form,
    current_user,
    guard_action,
    parse,
    redirect,
    render,
    run_action,
    to_sign_in,
    unit_of_work,
)
from controlplane.deps import IdPath
from controlplane.topology import service as topology_service
from cutover import flows, safety, zonal_shift
from cutover import service as cutover_service
from cutover.endpoints import runtime_for
from cutover.errors import BreakGlassNeedsAdmin
from cutover.scope import Scope, ScopeKind
from cutover.runner import abort_request
from cutover.schemas import CutoverPlanRequest, ExecuteRequest, RollbackRequest, ZonalShiftStart
from cutover.states import CutoverState

router = APIRouter()

ROLLBACK_FROM = {CutoverState.COMPLETED.value, CutoverState.FAILED.value}
ABORT_FROM = {CutoverState.EXECUTING.value, CutoverState.VERIFYING.value}  # what cutover.flows.abort takes


def page_user(request: Request) -> ConsoleUser | Response:
    user = current_user(request)
    return to_sign_in(request) if user is None else user


@router.get("/console/cutovers", include_in_schema=False, name="console.cutovers")
def cutovers(request: Request, state: CutoverState | None = None) -> Response:
    user = page_user(request)
    if not isinstance(user, ConsoleUser):
        return user
    with request.app.state.read_session_factory() as session:
        rows = list(cutover_service.list_cutovers(session, state=state, scope=None, limit=200))
        shifts = list(zonal_shift.list_shifts(session))
        gate = cutover_service.get_gate(session)
        regions = [r.name for r in topology_service.list_regions(session)]
    runtime = runtime_for(request.app.state)
    return render(request, "cutovers.jinja", user=user, section="cutovers", cutovers=rows,
                  shifts=sorted(shifts, key=lambda s: -s.id), gate=gate, state_filter=state, regions=regions,
                  tiers=[t for t in ("l7", "mesh", "anycast", "dns") if runtime.drivers_for(_tier(t))],
                  max_shift_h=runtime.policy.max_zonal_shift.total_seconds() / 3600)


def _tier(value: str) -> Any:
    from contract.routing_tier import RoutingTier

    return RoutingTier(value)


@router.post("/console/cutovers", include_in_schema=False, name="console.cutover_plan")
def plan(request: Request, form: Form) -> Response:
    """Plan (changes no routing): the steps with their expected before/after, then the cutover's page."""
    checked = guard_action(request, form, Role.OPERATOR)
    if not isinstance(checked, ConsoleUser):
        return checked
    user = checked

    def act() -> Response:
        kind = form.get("scope_kind", "")
        body = parse(CutoverPlanRequest, {
            "scope": {"kind": kind, "region": form.get("region", "").strip(),
                      "name": (form.get("name", "").strip() or None) if kind != "region" else None},
            "tier": form.get("tier", "l7"), "target_state": form.get("target_state", "out"),
            "reason": form.get("reason", ""),
            "generation": form.get("generation") or None,
        })
        runtime = runtime_for(request.app.state)
        scope = Scope(body.scope.kind, body.scope.region, body.scope.name or body.scope.region)
        with unit_of_work(request) as session:
            cutover, _ = cutover_service.plan(
                session, runtime, scope=scope, tiers=[body.tier], target_state=body.target_state,
                reason=body.reason, mode=body.mode, actor=user.actor, generation=body.generation,
            )
            cutover_id = cutover.id
        return redirect(f"/console/cutovers/{cutover_id}")

    return run_action(request, user, act, back="/console/cutovers")


def _violations(request: Request, session: Any, cutover: Any) -> list[dict[str, Any]]:
    runtime = runtime_for(request.app.state)
    return [v.as_json() for v in safety.evaluate(session, cutover=cutover, policy=runtime.policy,
                                                 clock=runtime.clock, capacity=runtime.capacity)]


def cutover_page(request: Request, user: ConsoleUser, cutover_id: int, template: str, **extra: Any) -> Response:
    """A cutover's page (or one of its confirmations): summary, steps, and which actions its state allows."""
    with request.app.state.read_session_factory() as session:
        cutover = cutover_service.get_or_raise(session, cutover_id=cutover_id)
        steps = sorted(cutover.steps, key=lambda s: s.position)
        violations = _violations(request, session, cutover) if cutover.state == CutoverState.PLANNED else []
        shift = next((s for s in zonal_shift.list_shifts(session) if s.cutover_id == cutover.id), None)
        abort = abort_request(session, cutover) if cutover.state in ABORT_FROM else None
    return render(request, template, user=user, section="cutovers", cutover=cutover, steps=steps,
                  violations=violations, shift=shift, can_roll_back=cutover.state in ROLLBACK_FROM,
                  abort_request=abort, can_abort=cutover.state in ABORT_FROM and abort is None, **extra)


@router.get("/console/cutovers/{cutover_id}", include_in_schema=False, name="console.cutover")
def cutover_detail(cutover_id: IdPath, request: Request) -> Response:
    user = page_user(request)
    if not isinstance(user, ConsoleUser):
        return user
    return run_action(request, user, lambda: cutover_page(request, user, cutover_id, "cutover.jinja"),
                      back="/console/cutovers")


@router.get("/console/cutovers/{cutover_id}/execute", include_in_schema=False, name="console.cutover_confirm")
def confirm_execute(cutover_id: IdPath, request: Request) -> Response:
    user = page_user(request)
    if not isinstance(user, ConsoleUser):
        return user
    # One key per confirmation: a double submit of this form runs the cutover once (flows.execute is idempotent).
    key = f"console-{cutover_id}-{secrets.token_hex(8)}"
    return run_action(request, user, lambda: cutover_page(request, user, cutover_id, "confirm_execute.jinja",
                                                           idempotency_key=key), back=f"/console/cutovers/{cutover_id}")


@router.post("/console/cutovers/{cutover_id}/execute", include_in_schema=False, name="console.cutover_execute")
def execute(cutover_id: IdPath, request: Request, form: Form) -> Response:
    checked = guard_action(request, form, Role.OPERATOR)
    if not isinstance(checked, ConsoleUser):
        return checked
    user = checked

    def act() -> Response:
        body = parse(ExecuteRequest, {
            "idempotency_key": form.get("idempotency_key", ""), "break_glass": form.get("break_glass") == "on",
            "break_glass_reason": form.get("break_glass_reason") or None,
        })
        if body.break_glass and not user.may(Role.ADMIN):
            raise BreakGlassNeedsAdmin("break-glass overrides safety rules and needs an admin token")
        flows.execute(runtime_for(request.app.state), cutover_id=cutover_id, idempotency_key=body.idempotency_key,
                      actor=user.actor, break_glass=body.break_glass, break_glass_reason=body.break_glass_reason)
        return redirect(f"/console/cutovers/{cutover_id}")

    return run_action(request, user, act, back=f"/console/cutovers/{cutover_id}")


@router.get("/console/cutovers/{cutover_id}/rollback", include_in_schema=False, name="console.rollback_confirm")
def confirm_rollback(cutover_id: IdPath, request: Request) -> Response:
    user = page_user(request)
    if not isinstance(user, ConsoleUser):
        return user
    return run_action(request, user, lambda: cutover_page(request, user, cutover_id, "confirm_rollback.jinja"),
                      back=f"/console/cutovers/{cutover_id}")


@router.post("/console/cutovers/{cutover_id}/rollback", include_in_schema=False, name="console.cutover_rollback")
def rollback(cutover_id: IdPath, request: Request, form: Form) -> Response:
    return reasoned_action(request, form, cutover_id, flows.rollback)


def reasoned_action(request: Request, form: dict[str, str], cutover_id: int,
                    flow: Callable[..., object]) -> Response:
    """An operator's rollback or abort of one cutover: `flow` as the REST route calls it, the reason as it checks it."""
    checked = guard_action(request, form, Role.OPERATOR)
    if not isinstance(checked, ConsoleUser):
        return checked
    user = checked

    def act() -> Response:
        body = parse(RollbackRequest, {"reason": form.get("reason", "")})
        flow(runtime_for(request.app.state), cutover_id=cutover_id, actor=user.actor, reason=body.reason)
        return redirect(f"/console/cutovers/{cutover_id}")

    return run_action(request, user, act, back=f"/console/cutovers/{cutover_id}")


# --- zonal shifts --------------------------------------------------------------------------------------------------

def _shift_form(form: dict[str, str]) -> ZonalShiftStart:
    hours = form.get("expires_in_h", "").strip()
    try:
        expires_in: Any = timedelta(hours=float(hours)) if hours else None
    except (ValueError, OverflowError):  # "soon", "nan", "inf", "1e300": timedelta raises either
        expires_in = hours  # let the schema name the field
    return parse(ZonalShiftStart, {"region": form.get("region", "").strip(), "zone": form.get("zone", "").strip(),
                                   "expires_in": expires_in, "reason": form.get("reason", "")})


@router.get("/console/zonal-shifts/new", include_in_schema=False, name="console.shift_confirm")
def confirm_shift(request: Request, region: str = "", zone: str = "", expires_in_h: str = "",
                  reason: str = "") -> Response:
    """What starting the shift would do: the zone's clusters drain (l7), anycast withdraws if configured."""
    user = page_user(request)
    if not isinstance(user, ConsoleUser):
        return user

    def page() -> Response:
        body = _shift_form({"region": region, "zone": zone, "expires_in_h": expires_in_h, "reason": reason})
        runtime = runtime_for(request.app.state)
        scope = Scope(ScopeKind.ZONE, body.region, body.zone)
        with request.app.state.read_session_factory() as session:
            clusters = [c for c in topology_service.list_clusters(session, region=body.region) if c.zone == body.zone]
            before = safety.serving_regions(session, [])
            after = safety.serving_regions(session, [scope])
            stopped, why = safety.gate_stopped(session)
        stranded = sorted(m for m, regions in before.items() if regions and not after.get(m))
        return render(request, "confirm_shift.jinja", user=user, section="cutovers", shift=body,
                      expires_in_h=expires_in_h, clusters=clusters, stranded=stranded, gate_stopped=stopped,
                      gate_reason=why, anycast=bool(runtime.drivers_for(_tier("anycast"))),
                      min_wait_s=runtime.policy.min_wait.total_seconds())

    return run_action(request, user, page, back="/console/cutovers")


@router.post("/console/zonal-shifts", include_in_schema=False, name="console.shift_start")
def start_shift(request: Request, form: Form) -> Response:
    checked = guard_action(request, form, Role.OPERATOR)
    if not isinstance(checked, ConsoleUser):
        return checked
    user = checked

    def act() -> Response:
        body = _shift_form(form)
        shift = zonal_shift.start(runtime_for(request.app.state), region=body.region, zone=body.zone,
                                  expires_in=body.expires_in, reason=body.reason, actor=user.actor)
        return redirect(f"/console/cutovers/{shift.cutover_id}")

    return run_action(request, user, act, back="/console/cutovers")


@router.get("/console/zonal-shifts/{shift_id}/cancel", include_in_schema=False, name="console.shift_cancel_confirm")
def confirm_cancel(shift_id: IdPath, request: Request) -> Response:
    user = page_user(request)
    if not isinstance(user, ConsoleUser):
        return user

    def page() -> Response:
        with request.app.state.read_session_factory() as session:
            shift = zonal_shift.get_or_raise(session, shift_id=shift_id)
        return cutover_page(request, user, shift.cutover_id, "confirm_cancel.jinja", cancel_shift=shift)

    return run_action(request, user, page, back="/console/cutovers")


@router.post("/console/zonal-shifts/{shift_id}/cancel", include_in_schema=False, name="console.shift_cancel")
def cancel_shift(shift_id: IdPath, request: Request, form: Form) -> Response:
    checked = guard_action(request, form, Role.OPERATOR)
    if not isinstance(checked, ConsoleUser):
        return checked
    user = checked

    def act() -> Response:
        reason = parse(RollbackRequest, {"reason": form.get("reason", "")}).reason
        shift = zonal_shift.cancel(runtime_for(request.app.state), shift_id=shift_id, actor=user.actor,
                                   reason=reason)
        return redirect(f"/console/cutovers/{shift.cutover_id}")

    return run_action(request, user, act, back="/console/cutovers")
