"""One real Celery worker on RabbitMQ runs the beat's drill task against the real database.

Needs RabbitMQ at 127.0.0.1:5672 (guest/guest), as the development machines
run it. The worker consumes a queue of its own, so other workers on the same
broker never take the task.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from controlplane.celery_app import create_celery
from controlplane.config import ControlPlaneSettings
from controlplane.db import session_scope
from controlplane.drill import service
from controlplane.drill.schemas import DrillSpec
from controlplane.drill.tasks import SCHEDULE_DUE

BROKER = os.environ.get("LIFELINE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
ROOT = Path(__file__).resolve().parents[3]


def test_a_celery_worker_on_rabbitmq_schedules_due_drills(database_url, session_factory, clock, tmp_path):
    with session_scope(session_factory) as session:
        for body in ({"name": "kill-one", "model": "tiny", "scope": "instance", "fault": "sigkill",
                      "blast_radius": {"region": "local", "instances": ["victim"]}},
                     {"name": "lose-a", "model": "tiny", "scope": "zone", "fault": "zone_loss",
                      "blast_radius": {"region": "local", "zones": ["local-a"]}}):
            service.define(session, spec=DrillSpec.model_validate(body), actor="t", clock=clock)
    queue = f"lifeline-drill-test-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "LIFELINE_CONTROLPLANE_DATABASE_URL": database_url,
           "LIFELINE_CONTROLPLANE_CELERY_BROKER_URL": BROKER, "LIFELINE_CONTROLPLANE_LOG_LEVEL": "info"}
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "controlplane.celery_app", "worker", "--pool=solo",
         f"--hostname={queue}@%h", "--concurrency=1", "-Q", queue, "--without-gossip", "--without-mingle"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        app = create_celery(ControlPlaneSettings(database_url=database_url, celery_broker_url=BROKER))
        app.send_task(SCHEDULE_DUE, queue=queue)
        deadline = time.monotonic() + 60
        runs: dict[str, tuple[str, str]] = {}
        while len(runs) < 2:
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()[-3000:]
            time.sleep(0.2)
            with session_scope(session_factory) as session:
                runs = {r.definition.name: (r.state, r.trigger) for r in service.list_runs(session)}
        assert runs == {"kill-one": ("scheduled", "schedule"), "lose-a": ("awaiting_approval", "schedule")}
        # Celery's own --loglevel (WARNING by default) would hide this INFO line: the control plane's
        # log_level governs the worker's logs.
        assert "lifeline.drill.schedule_due" in (tmp_path / "worker.log").read_text()
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        log.close()
