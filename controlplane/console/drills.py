"""Drills and SLOs: definitions, runs with their reports and timeline plots, approvals, and SLO documents.

Reads through `controlplane.drill.service` and `controlplane.slo.service`;
the plot is `controlplane.drill.report.plot_timeline` (matplotlib, Agg),
drawn on request from the stored report. Every action is an operator's and
calls the drill service as the REST route does, with the route's own
request schema: define (`DrillSpec`, pasted as JSON, `service.define`),
request a run (`service.create_run`, behind a confirmation page that shows
the definition's fault and blast radius), approve (`service.approve`),
abort (`AbortRequest`, `service.abort`, behind a confirmation). A run that
may start is handed to the dispatcher after the commit
(`controlplane.drill.endpoints._dispatch_later`), exactly as through the API.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Query, Request
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
from controlplane.deps import IdPath, NamePath
from controlplane.drill import report as drill_report
from controlplane.drill import repository as drill_repository
from controlplane.drill import service as drill_service
from controlplane.drill.endpoints import _dispatch_later
from controlplane.drill.schemas import AbortRequest, DrillSpec, RunRequest
from controlplane.drill.states import NEEDS_APPROVAL, TERMINAL_STATES, DrillRunState, DrillScope
from controlplane.errors import InvalidInput
from controlplane.slo import service as slo_service
from weight_catalog import service as catalog_service

router = APIRouter()


@router.get("/console/drills", include_in_schema=False, name="console.drills")
def drills(request: Request) -> Response:
    user = current_user(request)
    if user is None:
        return to_sign_in(request)
    with request.app.state.read_session_factory() as session:
        runs = list(drill_service.list_runs(session, limit=200))
        definitions = list(drill_repository.list_definitions(session))  # what GET /api/v1/drills lists
        models = sorted({v.model for v in catalog_service.list_versions(session)})
    return render(request, "drills.jinja", user=user, section="drills", runs=runs, models=models,
                  definitions=definitions, example=json.dumps(EXAMPLE_SPEC, indent=2))


# Shown in the define form: a complete instance drill the operator edits (DrillSpec's own field names).
EXAMPLE_SPEC = {"name": "kill-one-engine", "model": "tiny", "scope": "instance", "fault": "sigkill",
                "blast_radius": {"region": "eu", "instances": ["engine-1"], "max_instances": 1},
                "targets": {"request_rto_s": 2.0}, "description": "one engine killed mid-stream"}


@router.post("/console/drills", include_in_schema=False, name="console.drill_define")
def define(request: Request, form: Form) -> Response:
    """Define a drill (or the next version of a name) from a DrillSpec pasted as JSON, as POST /api/v1/drills."""
    checked = guard_action(request, form, Role.OPERATOR)
    if not isinstance(checked, ConsoleUser):
        return checked
    user = checked

    def act() -> Response:
        try:
            data = json.loads(form.get("spec", ""))
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"spec: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})",
                               param="spec") from None
        except RecursionError:  # "[[[[…" a few thousand deep fits in a form; the REST route's parser says 400
            raise InvalidInput("spec: nested too deeply to be a drill definition", param="spec") from None
        if not isinstance(data, dict):
            raise InvalidInput("spec: a JSON object with DrillSpec's fields", param="spec")
        spec = parse(DrillSpec, data)
        with unit_of_work(request) as session:
            definition = drill_service.define(session, spec=spec, actor=user.actor, clock=request.app.state.clock)
            name = definition.name
        return redirect(f"/console/drills#drill-{name}")

    return run_action(request, user, act, back="/console/drills")


@router.get("/console/drills/{name}/request", include_in_schema=False, name="console.drill_request_confirm")
def request_confirm(name: NamePath, request: Request,
                    version: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None) -> Response:
    """The confirmation before a run: what the drill faults, where, and whether it starts at once."""
    user = current_user(request)
    if user is None:
        return to_sign_in(request)

    def page() -> Response:
        with request.app.state.read_session_factory() as session:
            definition = drill_service.get_definition_or_raise(session, name=name, version=version)
        return render(request, "confirm_drill_run.jinja", user=user, section="drills", definition=definition,
                      needs_approval=DrillScope(definition.scope) in NEEDS_APPROVAL,
                      spec_json=json.dumps({"blast_radius": definition.blast_radius,
                                            "stop_conditions": definition.stop_conditions,
                                            "targets": definition.targets, "traffic": definition.traffic},
                                           indent=1, sort_keys=True))

    return run_action(request, user, page, back="/console/drills")


@router.post("/console/drills/{name}/runs", include_in_schema=False, name="console.drill_request")
def request_run(name: NamePath, request: Request, form: Form, tasks: BackgroundTasks) -> Response:
    """Request a run of the version the confirmation showed, as POST /api/v1/drills/{name}/runs."""
    checked = guard_action(request, form, Role.OPERATOR)
    if not isinstance(checked, ConsoleUser):
        return checked
    user = checked

    def act() -> Response:
        body = parse(RunRequest, {"version": form.get("version") or None})
        with unit_of_work(request) as session:
            definition = drill_service.get_definition_or_raise(session, name=name, version=body.version)
            run = drill_service.create_run(session, definition=definition, trigger="manual", actor=user.actor,
                                           clock=request.app.state.clock)
            run_id = run.id
            _dispatch_later(request, tasks, run)
        response = redirect(f"/console/drills/runs/{run_id}")
        response.background = tasks
        return response

    return run_action(request, user, act, back=f"/console/drills/{name}/request")


@router.get("/console/drills/runs/{run_id}", include_in_schema=False, name="console.drill_run")
def drill_run(run_id: IdPath, request: Request) -> Response:
    user = current_user(request)
    if user is None:
        return to_sign_in(request)

    def page() -> Response:
        with request.app.state.read_session_factory() as session:
            run = drill_service.get_run_or_raise(session, run_id=run_id)
        markdown = drill_report.to_markdown(run.report) if run.report else None
        return render(request, "drill_run.jinja", user=user, section="drills", run=run, markdown=markdown,
                      awaiting=run.state == DrillRunState.AWAITING_APPROVAL,
                      abortable=DrillRunState(run.state) not in TERMINAL_STATES,
                      has_timeline=bool(run.report and run.report.get("timeline") is not None))

    return run_action(request, user, page, back="/console/drills")


@router.get("/console/drills/runs/{run_id}/timeline.png", include_in_schema=False, name="console.drill_plot")
def drill_plot(run_id: IdPath, request: Request) -> Response:
    user = current_user(request)
    if user is None:
        return Response(status_code=401)
    with request.app.state.read_session_factory() as session:
        run = drill_service.get_run_or_raise(session, run_id=run_id)
    if not run.report:
        return Response(status_code=404)
    with tempfile.TemporaryDirectory(prefix="lifeline-console-") as directory:
        path = drill_report.plot_timeline(run.report, Path(directory) / "timeline.png")
        return Response(path.read_bytes(), media_type="image/png", headers={"Cache-Control": "no-store"})


@router.post("/console/drills/runs/{run_id}/approve", include_in_schema=False, name="console.drill_approve")
def approve(run_id: IdPath, request: Request, form: Form, tasks: BackgroundTasks) -> Response:
    """Approve a zone or region drill (operator); it starts after the commit, as through the REST route."""
    checked = guard_action(request, form, Role.OPERATOR)
    if not isinstance(checked, ConsoleUser):
        return checked
    user = checked

    def act() -> Response:
        with unit_of_work(request) as session:
            run = drill_service.approve(session, run_id=run_id, actor=user.actor, clock=request.app.state.clock)
            _dispatch_later(request, tasks, run)
        response = redirect(f"/console/drills/runs/{run_id}")
        response.background = tasks
        return response

    return run_action(request, user, act, back=f"/console/drills/runs/{run_id}")


@router.get("/console/drills/runs/{run_id}/abort", include_in_schema=False, name="console.drill_abort_confirm")
def abort_confirm(run_id: IdPath, request: Request) -> Response:
    """The confirmation before an abort: what stopping the run does in its state."""
    user = current_user(request)
    if user is None:
        return to_sign_in(request)

    def page() -> Response:
        with request.app.state.read_session_factory() as session:
            run = drill_service.get_run_or_raise(session, run_id=run_id)
        return render(request, "confirm_drill_abort.jinja", user=user, section="drills", run=run,
                      abortable=DrillRunState(run.state) not in TERMINAL_STATES)

    return run_action(request, user, page, back=f"/console/drills/runs/{run_id}")


@router.post("/console/drills/runs/{run_id}/abort", include_in_schema=False, name="console.drill_abort")
def abort(run_id: IdPath, request: Request, form: Form) -> Response:
    """Abort a run through `drill.service.abort`, as POST /api/v1/drills/runs/{id}/abort.

    A running drill's runner sees the abort within half a second and rolls
    its fault back; a finished run refuses (409 invalid_transition).
    """
    checked = guard_action(request, form, Role.OPERATOR)
    if not isinstance(checked, ConsoleUser):
        return checked
    user = checked

    def act() -> Response:
        body = parse(AbortRequest, {"reason": form.get("reason", "").strip()})
        with unit_of_work(request) as session:
            drill_service.abort(session, run_id=run_id, reason=body.reason, actor=user.actor,
                                clock=request.app.state.clock)
        return redirect(f"/console/drills/runs/{run_id}")

    return run_action(request, user, act, back=f"/console/drills/runs/{run_id}/abort")


@router.get("/console/slo/{model}", include_in_schema=False, name="console.slo")
def slo(model: NamePath, request: Request) -> Response:
    user = current_user(request)
    if user is None:
        return to_sign_in(request)

    def page() -> Response:
        with request.app.state.read_session_factory() as session:
            settings = request.app.state.settings
            document = slo_service.build(session, model=model, clock=request.app.state.clock,
                                         gateway_stale_after=settings.gateway_report_stale_after,
                                         agent_stale_after=settings.agent_report_stale_after,
                                         dns=request.app.state.dns_ttls)
        return render(request, "slo.jinja", user=user, section="drills", document=document)

    return run_action(request, user, page, back="/console/drills")
