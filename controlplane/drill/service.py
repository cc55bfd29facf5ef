"""Drill logic: define, schedule, approve, start, abort, finish. Never commits; the caller's unit of work does.

Every state change goes through `states.transition()` and is persisted by
compare-and-set, so an abort racing a runner's `fault_cleared` has exactly
one winner and the loser gets `drill_run_changed` (409).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from common.clock import Clock
from controlplane.drill import repository
from controlplane.drill.errors import (
    ApprovalRequired,
    DrillNotFound,
    DrillRunChanged,
    DrillRunNotFound,
)
from controlplane.drill.models import DrillDefinition, DrillRun
from controlplane.drill.schemas import DrillSpec
from controlplane.drill.states import (
    NEEDS_APPROVAL,
    TERMINAL_STATES,
    DrillRunEvent,
    DrillRunState,
    DrillScope,
    may_start,
    transition,
)
from controlplane.event import service as event_service

# Instance drills weekly (automatic), zone monthly, region quarterly (both approved by a person).
DEFAULT_CADENCE: dict[DrillScope, timedelta] = {
    DrillScope.INSTANCE: timedelta(days=7),
    DrillScope.ZONE: timedelta(days=30),
    DrillScope.REGION: timedelta(days=91),
}


def define(session: Session, *, spec: DrillSpec, actor: str, clock: Clock) -> DrillDefinition:
    """Add `spec` as the next version of its name (version 1 for a new name)."""
    definition = DrillDefinition(
        name=spec.name, version=repository.latest_version(session, name=spec.name) + 1, model=spec.model,
        scope=spec.scope.value, fault=spec.fault.value, region=spec.blast_radius.region,
        blast_radius=spec.blast_radius.model_dump(mode="json"),
        stop_conditions=spec.stop_conditions.model_dump(mode="json"), expected_tier=spec.expected_tier,
        targets=spec.targets.model_dump(mode="json"), traffic=spec.traffic.model_dump(mode="json"),
        description=spec.description, created_by=actor, created_at=clock.utcnow(),
    )
    session.add(definition)
    session.flush()
    return definition


def get_definition_or_raise(session: Session, *, name: str, version: int | None = None) -> DrillDefinition:
    definition = repository.get_definition(session, name=name, version=version)
    if definition is None:
        raise DrillNotFound(f"no drill {name!r}" + (f" version {version}" if version else ""))
    return definition


def get_run_or_raise(session: Session, *, run_id: int, fresh: bool = False) -> DrillRun:
    run = repository.get_run(session, run_id=run_id, fresh=fresh)
    if run is None:
        raise DrillRunNotFound(f"no drill run {run_id}")
    return run


def create_run(session: Session, *, definition: DrillDefinition, trigger: str, actor: str, clock: Clock) -> DrillRun:
    """A new run in `scheduled`; a zone or region run is held in `awaiting_approval` at once."""
    now = clock.utcnow()
    state = DrillRunState.SCHEDULED
    if DrillScope(definition.scope) in NEEDS_APPROVAL:
        state = transition(state, DrillRunEvent.HOLD)
    run = DrillRun(definition_id=definition.id, model=definition.model, scope=definition.scope, state=state.value,
                   revision=1, trigger=trigger, requested_by=actor, created_at=now, updated_at=now)
    session.add(run)
    session.flush()
    run.definition = definition
    return run


def advance(session: Session, *, run: DrillRun, event: DrillRunEvent, clock: Clock, **values: Any) -> DrillRun:
    """Apply `event` by compare-and-set on the run as read; `DrillRunChanged` if someone else moved it first."""
    target = transition(run.state, event)
    now = clock.utcnow()
    if target in TERMINAL_STATES:
        values.setdefault("ended_at", now)
    if not repository.compare_and_set(session, run_id=run.id, expected_state=run.state,
                                      expected_revision=run.revision, state=target.value, updated_at=now, **values):
        raise DrillRunChanged(f"drill run {run.id} changed while being moved by {event}; read it again")
    return get_run_or_raise(session, run_id=run.id, fresh=True)


def approve(session: Session, *, run_id: int, actor: str, clock: Clock) -> DrillRun:
    run = get_run_or_raise(session, run_id=run_id)
    run = advance(session, run=run, event=DrillRunEvent.APPROVE, clock=clock, approved_by=actor,
                  approved_at=clock.utcnow())
    _record(session, run, kind="drill.approved", actor=actor, reason="approved", clock=clock)
    return run


def start(session: Session, *, run_id: int, fault_target: str, actor: str, clock: Clock,
          fault_generation: int | None = None) -> DrillRun:
    """`fault_generation`: an instance drill's target generation, as its engine reported it (None: unknown)."""
    run = get_run_or_raise(session, run_id=run_id, fresh=True)
    if run.state == DrillRunState.SCHEDULED and not may_start(run.scope, approved=run.approved_by is not None):
        raise ApprovalRequired(f"drill run {run.id} is a {run.scope} drill: an operator must approve it first")
    run = advance(session, run=run, event=DrillRunEvent.START, clock=clock, started_at=clock.utcnow(),
                  fault_target=fault_target,
                  fault_generation=fault_generation if run.scope == DrillScope.INSTANCE else None)
    _record(session, run, kind="drill.started", actor=actor, reason=f"fault {run.definition.fault} on {fault_target}",
            clock=clock)
    return run


def abort(session: Session, *, run_id: int, reason: str, actor: str, clock: Clock,
          report: dict[str, Any] | None = None) -> DrillRun:
    run = get_run_or_raise(session, run_id=run_id, fresh=True)
    values: dict[str, Any] = {"abort_reason": reason}
    if report is not None:
        values["report"] = report
    run = advance(session, run=run, event=DrillRunEvent.ABORT, clock=clock, **values)
    _record(session, run, kind="drill.aborted", actor=actor, reason=reason, clock=clock)
    return run


def list_runs(session: Session, *, state: str | None = None, model: str | None = None,
              name: str | None = None, limit: int = 100) -> Sequence[DrillRun]:
    return repository.list_runs(session, state=state, model=model, definition_name=name, limit=limit)


def is_due(*, scope: DrillScope | str, last_run_at: datetime | None, now: datetime,
           cadence: dict[DrillScope, timedelta] | None = None) -> bool:
    """Pure: a definition whose last run is older than its scope's cadence (or that never ran) is due."""
    period = (cadence or DEFAULT_CADENCE)[DrillScope(scope)]
    return last_run_at is None or now - last_run_at >= period


def schedule_due(session: Session, *, clock: Clock, cadence: dict[DrillScope, timedelta] | None = None,
                 actor: str = "beat") -> list[DrillRun]:
    """The beat's due-check: one new run for each definition (latest version) whose cadence has come round.

    A definition with a run not yet ended (scheduled, awaiting approval,
    running, measuring) is not due again: approvals do not pile up.
    """
    now = clock.utcnow()
    created = []
    for definition in repository.list_definitions(session):
        runs = repository.runs_of_name(session, name=definition.name)
        if any(DrillRunState(r.state) not in TERMINAL_STATES for r in runs):
            continue
        last = max((r.created_at for r in runs), default=None)
        if is_due(scope=definition.scope, last_run_at=last, now=now, cadence=cadence):
            created.append(create_run(session, definition=definition, trigger="schedule", actor=actor, clock=clock))
    return created


def _record(session: Session, run: DrillRun, *, kind: str, actor: str, reason: str, clock: Clock) -> None:
    """One event of the run, scoped to what it faulted; an instance's names its generation (`after.generation`).

    A zone drill's target is a zone (`region:r/zone:z`), not an instance as the scope once said; a region
    drill's is its region.
    """
    definition = run.definition
    after: dict[str, Any] = {"drill": definition.name, "version": definition.version, "run": run.id,
                             "state": run.state}
    scope = f"region:{definition.region}"
    if run.fault_target and run.scope == DrillScope.INSTANCE:
        scope += f"/instance:{run.fault_target}"
        after["generation"] = run.fault_generation
    elif run.fault_target and run.scope == DrillScope.ZONE:
        scope += f"/zone:{run.fault_target}"
    event_service.record(session, kind=kind, actor=actor, reason=reason, scope=scope, clock=clock, after=after,
                         outcome="succeeded")
