"""Drills and SLOs: runs with their reports and timeline plots, approvals, and each model's SLO document.

Reads through `controlplane.drill.service` and `controlplane.slo.service`;
the plot is `controlplane.drill.report.plot_timeline` (matplotlib, Agg),
drawn on request from the stored report. Approval calls
`controlplane.drill.service.approve` and then starts the run the way the REST
route does (`controlplane.drill.endpoints._dispatch_later`, after the commit).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from fastapi import APIRouter, BackgroundTasks, Request
from fastapi.responses import Response

from controlplane.auth.roles import Role
from controlplane.console.pages import Form
from controlplane.console.session import ConsoleUser
from controlplane.console.web import (
    current_user,
    guard_action,
    redirect,
    render,
    run_action,
    to_sign_in,
    unit_of_work,
)
from controlplane.deps import IdPath, NamePath
from controlplane.drill import report as drill_report
from controlplane.drill import service as drill_service
from controlplane.drill.endpoints import _dispatch_later
from controlplane.drill.states import DrillRunState
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
        models = sorted({v.model for v in catalog_service.list_versions(session)})
    return render(request, "drills.jinja", user=user, section="drills", runs=runs, models=models)


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


@router.get("/console/slo/{model}", include_in_schema=False, name="console.slo")
def slo(model: NamePath, request: Request) -> Response:
    user = current_user(request)
    if user is None:
        return to_sign_in(request)

    def page() -> Response:
        with request.app.state.read_session_factory() as session:
            document = slo_service.build(session, model=model, clock=request.app.state.clock)
        return render(request, "slo.jinja", user=user, section="drills", document=document)

    return run_action(request, user, page, back="/console/drills")
