"""The Celery app and its beat schedule. Nothing is built at import: `create_celery(settings)`.

Broker from settings (`LIFELINE_CONTROLPLANE_CELERY_BROKER_URL`): RabbitMQ
(`amqp://guest:guest@127.0.0.1:5672//`) or Redis (`redis://127.0.0.1:6379/0`).
Unset is the embedded default: tasks run in-process when sent
(`task_always_eager`), so a single-binary control plane needs no broker.

Beat schedule:

    drill-cadence   every `drill_cadence_check` (1 h): `lifeline.drill.schedule_due`, which
                    creates a run for each definition whose cadence came round (instance
                    weekly, zone monthly, region quarterly: `drill.service.DEFAULT_CADENCE`)
                    and sends `lifeline.drill.run` for the instance runs; zone and region
                    runs wait for `POST /api/v1/drills/runs/{id}/approve`
    replication-sweep  every `LIFELINE_REPLICATION_SWEEP_EVERY` (5 s): `lifeline.replication.sweep`,
                    which replicates each due KV replication policy on the `LIFELINE_REPLICATION_QUEUE`
                    queue (controlplane/replication/tasks.py)

`celery -A controlplane.celery_app worker` and `… beat` find `app`, built
on first access from the environment (PEP 562 module `__getattr__`).
The schedule's `nowfun` is the injected clock, so a test asks the beat's own
due-check (`schedule.is_due`) on virtual time.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery import Celery
from celery.signals import setup_logging
from celery.schedules import schedule

from common.clock import Clock, SystemClock
from common.logs import configure_logging
from controlplane.config import ControlPlaneSettings
from controlplane.drill import tasks as drill_tasks
from controlplane.replication import tasks as replication_tasks
from controlplane.replication.config import ReplicationSettings

DRILL_CADENCE_ENTRY = "drill-cadence"


def create_celery(settings: ControlPlaneSettings, *, clock: Clock | None = None,
                  replication: ReplicationSettings | None = None) -> Celery:
    clock = clock or SystemClock()
    broker = settings.celery_broker_url
    app = Celery("lifeline", broker=broker or "memory://", set_as_current=False)
    every: timedelta = settings.drill_cadence_check
    app.conf.update(
        task_always_eager=broker is None,
        task_eager_propagates=True,
        task_ignore_result=True,
        timezone="UTC",
        enable_utc=True,
        broker_connection_retry_on_startup=True,
        beat_schedule={DRILL_CADENCE_ENTRY: {"task": drill_tasks.SCHEDULE_DUE,
                                             "schedule": schedule(run_every=every, nowfun=clock.utcnow)}},
    )
    factory_holder: dict[str, Any] = {}

    def factory() -> Any:
        if "factory" not in factory_holder:
            from controlplane.db import build_engine, build_session_factory

            engine = build_engine(settings.resolved_database_url(), timeouts=settings.database_timeouts())
            factory_holder["factory"] = build_session_factory(engine)
        return factory_holder["factory"]

    replication_tasks.register(app, factory=factory, clock=clock, s3_endpoint_url=settings.s3_endpoint_url,
                               settings=replication or ReplicationSettings())
    fleet_file = settings.drill_fleet_file

    @app.task(name=drill_tasks.SCHEDULE_DUE, shared=False)  # one app per process call: never shared across apps
    def schedule_due_drills() -> list[int]:
        ready = drill_tasks.schedule_due(factory(), clock=clock)
        if fleet_file is not None:
            for run_id in ready:
                run_drill.delay(run_id)
        return ready

    @app.task(name=drill_tasks.RUN, shared=False)
    def run_drill(run_id: int) -> str:
        from controlplane.drill.fleet import FileFleet
        from controlplane.drill.runner import HttpEventReader

        if fleet_file is None:
            raise RuntimeError("LIFELINE_CONTROLPLANE_DRILL_FLEET_FILE is not set: no fleet to drill")
        fleet = FileFleet.load(fleet_file)
        events = (HttpEventReader(fleet.spec.events.controlplane_url, fleet.spec.events.token)
                  if fleet.spec.events else None)
        return drill_tasks.run(factory(), run_id, fleet=fleet, events=events, clock=clock,
                               report_dir=settings.drill_report_dir)

    return app


def _own_logging(**_: Any) -> None:
    """Celery's `setup_logging` hook: with a receiver, Celery leaves the root logger alone, so a worker and
    beat log the control plane's JSON lines at its `log_level` (Celery's own `--loglevel` would set WARNING)."""
    configure_logging(ControlPlaneSettings().log_level, component="controlplane-celery")


def __getattr__(name: str) -> Any:
    if name == "app":
        global app
        setup_logging.connect(_own_logging, weak=False)
        app = create_celery(ControlPlaneSettings())
        return app
    raise AttributeError(name)
