"""Thin Celery wrappers around the drill service and runner; registered by `controlplane.celery_app`.

    lifeline.drill.schedule_due   the beat's cadence check (hourly): new runs for definitions whose
                                  cadence came round; instance runs are dispatched at once, zone and
                                  region runs wait in awaiting_approval for a person
    lifeline.drill.run            run one drill run on the configured fleet (`drill_fleet_file`)
"""

from __future__ import annotations

from typing import Any

from common.clock import Clock, SystemClock
from common.logs import get_logger
from controlplane.db import session_scope
from controlplane.drill import service
from controlplane.drill.states import DrillRunState

log = get_logger(__name__)

SCHEDULE_DUE = "lifeline.drill.schedule_due"
RUN = "lifeline.drill.run"


def schedule_due(factory: Any, *, clock: Clock | None = None) -> list[int]:
    """Create the due runs; return the ids of those that may start now (instance runs)."""
    with session_scope(factory) as session:
        created = service.schedule_due(session, clock=clock or SystemClock())
        return [run.id for run in created if run.state == DrillRunState.SCHEDULED]


def run(factory: Any, run_id: int, *, fleet: Any, events: Any = None, clock: Clock | None = None,
        report_dir: Any = None) -> str:
    from controlplane.drill.runner import DrillRunner

    outcome = DrillRunner(factory=factory, fleet=fleet, events=events, clock=clock or SystemClock(),
                                  report_dir=report_dir).run(run_id)
    return outcome.state.value
