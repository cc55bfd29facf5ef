"""Abort a running cutover and set or release the cutover stop switch, each behind a confirmation page.

Both call what the REST routes call, on the app's one `CutoverRuntime`:
`cutover.flows.abort` (POST /api/v1/cutovers/{id}/abort: a
`cutover.abort_requested` event the runner reads at its next step
boundary, or a rollback at once when no runner holds the cutover) and
`cutover.service.require_gate_role` + `set_gate` (PUT
/api/v1/cutover-gate: a `cutover.gate` event; stop is an operator's,
release an admin's). Forms are validated by the REST routes' own schemas,
guarded by the console's session, CSRF and role checks
(`controlplane.console.web.guard_action`); the stop-switch form carries
the revision its page showed, so a stale page or a double submit changes
nothing (409 `gate_conflict`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from controlplane.auth.roles import Role
from controlplane.console.cutovers import cutover_page, page_user, reasoned_action
from controlplane.console.session import ConsoleUser
from controlplane.console.web import Form, guard_action, parse, redirect, render, run_action, unit_of_work
from controlplane.deps import IdPath
from cutover import flows, service as cutover_service
from cutover.endpoints import runtime_for
from cutover.runner import claim_live
from cutover.schemas import GateUpdate
from cutover.states import CutoverState

router = APIRouter()


@router.get("/console/cutovers/{cutover_id}/abort", include_in_schema=False, name="console.cutover_abort_confirm")
def confirm_abort(cutover_id: IdPath, request: Request) -> Response:
    """What aborting does now: stop at the next step boundary (a live runner) or roll back at once (none)."""
    user = page_user(request)
    if not isinstance(user, ConsoleUser):
        return user
    runtime = runtime_for(request.app.state)

    def page() -> Response:
        with request.app.state.read_session_factory() as session:
            cutover = cutover_service.get_or_raise(session, cutover_id=cutover_id)
            live = claim_live(cutover, runtime)
        return cutover_page(request, user, cutover_id, "confirm_abort.jinja", runner_live=live)

    return run_action(request, user, page, back=f"/console/cutovers/{cutover_id}")


@router.post("/console/cutovers/{cutover_id}/abort", include_in_schema=False, name="console.cutover_abort")
def abort(cutover_id: IdPath, request: Request, form: Form) -> Response:
    return reasoned_action(request, form, cutover_id, flows.abort)


@router.get("/console/cutover-gate", include_in_schema=False, name="console.gate_confirm")
def confirm_gate(request: Request) -> Response:
    """The stop switch as it is, the one change it allows, and what that change does to the cutovers running now."""
    user = page_user(request)
    if not isinstance(user, ConsoleUser):
        return user
    with request.app.state.read_session_factory() as session:
        gate = cutover_service.get_gate(session)
        running = [c for state in (CutoverState.EXECUTING, CutoverState.VERIFYING)
                   for c in cutover_service.list_cutovers(session, state=state, limit=200)]
    stopped = bool(gate and gate.stopped)
    return render(request, "confirm_gate.jinja", user=user, section="cutovers", gate=gate, stopped=stopped,
                  revision=gate.revision if gate else 0, running=sorted(running, key=lambda c: c.id),
                  may_change=user.may(Role.ADMIN if stopped else Role.OPERATOR))


@router.post("/console/cutover-gate", include_in_schema=False, name="console.gate_set")
def set_gate(request: Request, form: Form) -> Response:
    checked = guard_action(request, form, Role.OPERATOR)
    if not isinstance(checked, ConsoleUser):
        return checked
    user = checked

    def act() -> Response:
        body = parse(GateUpdate, {"stopped": form.get("stopped", ""), "reason": form.get("reason", ""),
                                  "expected_revision": form.get("expected_revision") or None})
        cutover_service.require_gate_role(user.role, stopped=body.stopped)
        with unit_of_work(request) as session:
            cutover_service.set_gate(session, stopped=body.stopped, reason=body.reason, actor=user.actor,
                                     clock=request.app.state.clock, expected_revision=body.expected_revision)
        return redirect("/console/cutovers")

    return run_action(request, user, act, back="/console/cutover-gate")
