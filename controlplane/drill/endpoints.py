"""Drill routes under /api/v1. Thin: parse, call the service, shape.

    POST /drills                          define (or add the next version of a name)   operator
    GET  /drills                          latest version of each definition             viewer
    GET  /drills/{name}[?version=]                                                       viewer
    POST /drills/{name}/runs              request a run (zone/region: awaiting approval) operator
    GET  /drills/runs[?state&model&name]                                                 viewer
    GET  /drills/runs/{id}                the run and its report                         viewer
    POST /drills/runs/{id}/approve        a person approves a zone or region run         operator
    POST /drills/runs/{id}/abort          stop it (a running drill rolls back)           operator

A run that may start (an instance run, or an approved one) is handed to the
app's drill dispatcher (`app.state.drill_dispatch`, set by the composition
root: a Celery task, or in-process) after the request's unit of work has
committed; with none configured it stays `scheduled` for a runner to claim.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, BackgroundTasks, Query, Request

from controlplane.auth.dependencies import Operator, Viewer
from controlplane.db import DbSession
from controlplane.deps import ClockDep, IdPath, NamePath
from controlplane.drill import service
from controlplane.drill.schemas import (
    AbortRequest,
    DrillDefinitionRead,
    DrillRunRead,
    DrillSpec,
    RunRequest,
)
from controlplane.drill.states import DrillRunState, may_start

router = APIRouter(tags=["drill"])


def _dispatch_later(request: Request, tasks: BackgroundTasks, run: Any) -> None:
    dispatch = getattr(request.app.state, "drill_dispatch", None)
    if dispatch is not None and run.state == DrillRunState.SCHEDULED and may_start(
            run.scope, approved=run.approved_by is not None):
        tasks.add_task(dispatch, run.id)  # runs after the response, so after the commit


@router.post("/drills", status_code=201, response_model=DrillDefinitionRead)
def define_drill(body: DrillSpec, session: DbSession, principal: Operator, clock: ClockDep) -> Any:
    return service.define(session, spec=body, actor=principal.actor, clock=clock)


@router.get("/drills", response_model=list[DrillDefinitionRead])
def list_drills(session: DbSession, _: Viewer) -> Any:
    from controlplane.drill import repository

    return repository.list_definitions(session)


@router.get("/drills/runs", response_model=list[DrillRunRead])
def list_runs(
    session: DbSession,
    _: Viewer,
    state: DrillRunState | None = None,
    model: Annotated[str | None, Query(max_length=128, pattern=r"^[^\x00]*$")] = None,
    name: Annotated[str | None, Query(max_length=128, pattern=r"^[^\x00]*$")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Any:
    return service.list_runs(session, state=state.value if state else None, model=model, name=name, limit=limit)


@router.get("/drills/runs/{run_id}", response_model=DrillRunRead)
def get_run(run_id: IdPath, session: DbSession, _: Viewer) -> Any:
    return service.get_run_or_raise(session, run_id=run_id)


@router.post("/drills/runs/{run_id}/approve", response_model=DrillRunRead)
def approve_run(run_id: IdPath, request: Request, tasks: BackgroundTasks, session: DbSession, principal: Operator,
                clock: ClockDep) -> Any:
    run = service.approve(session, run_id=run_id, actor=principal.actor, clock=clock)
    _dispatch_later(request, tasks, run)
    return run


@router.post("/drills/runs/{run_id}/abort", response_model=DrillRunRead)
def abort_run(run_id: IdPath, body: AbortRequest, session: DbSession, principal: Operator, clock: ClockDep) -> Any:
    return service.abort(session, run_id=run_id, reason=body.reason, actor=principal.actor, clock=clock)


@router.get("/drills/{name}", response_model=DrillDefinitionRead)
def get_drill(name: NamePath, session: DbSession, _: Viewer,
              version: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None) -> Any:
    return service.get_definition_or_raise(session, name=name, version=version)


@router.post("/drills/{name}/runs", status_code=201, response_model=DrillRunRead)
def request_run(name: NamePath, request: Request, tasks: BackgroundTasks, session: DbSession, principal: Operator,
                clock: ClockDep, body: RunRequest | None = None) -> Any:
    definition = service.get_definition_or_raise(session, name=name, version=body.version if body else None)
    run = service.create_run(session, definition=definition, trigger="manual", actor=principal.actor, clock=clock)
    _dispatch_later(request, tasks, run)
    return run
