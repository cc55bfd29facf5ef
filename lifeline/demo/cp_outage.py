"""The demo's control-plane-down drill, run in its own process: `python -m lifeline.demo.cp_outage FLEET SECONDS`.

Why not through the API: a drill that silences the control plane's API
process cannot be run by that process (the drill refuses a fleet whose
control plane is the runner's own, docs/drills.md), and the embedded
default runs drill tasks in-process. So this process is the runner, as the
CLI or a Celery worker would be: it defines the drill, requests a run,
approves it as the demo's operator (a region drill needs a person's
approval), runs it on the fleet file (SIGSTOP the API the gateways poll for
SECONDS, SIGCONT) and prints the run's report as JSON. It records the run in
a database of its own (`LIFELINE_CONTROLPLANE_DATABASE_URL`, which the demo
points at `WORKDIR/drill-runner.sqlite3`): the API process it stops may be
stopped inside a write transaction, and SQLite would then lock the runner
out of a shared database.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

NAME = "demo-controlplane-down"


def main(fleet_file: Path, seconds: float, region: str) -> int:
    from common.clock import SystemClock
    from controlplane.cli_support import cli_database, load_settings
    from controlplane.db import session_scope
    from controlplane.drill import service
    from controlplane.drill.fleet import FileFleet
    from controlplane.drill.runner import DrillRunner, HttpEventReader
    from controlplane.drill.schemas import DrillSpec

    settings = load_settings()
    clock = SystemClock()
    spec = DrillSpec.model_validate({
        "name": NAME, "model": "tiny", "scope": "region", "fault": "controlplane_down",
        "blast_radius": {"region": region}, "stop_conditions": {"max_error_rate": 0.5},
        "targets": {"token_rpo_tokens": 0},
        "traffic": {"requests": 6, "concurrency": 2, "max_tokens": 16, "fault_after_tokens": 4,
                    "fault_duration_s": seconds}})
    fleet = FileFleet.load(fleet_file)
    assert fleet.spec.events is not None  # the demo writes them
    with cli_database(settings) as factory:
        with session_scope(factory) as session:
            definition = service.define(session, spec=spec, actor="operator:demo", clock=clock)
            run_id = service.create_run(session, definition=definition, trigger="manual", actor="operator:demo",
                                        clock=clock).id
            service.approve(session, run_id=run_id, actor="operator:demo", clock=clock)
        outcome = DrillRunner(factory=factory, fleet=fleet, clock=clock,
                              events=HttpEventReader(fleet.spec.events.controlplane_url, fleet.spec.events.token),
                              report_dir=settings.drill_report_dir).run(run_id)
    print(json.dumps({"run_id": run_id, "state": outcome.state.value, "report": outcome.report}, default=str))
    return 0


if __name__ == "__main__":  # pragma: no cover - run by the demo as a process
    sys.exit(main(Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3]))
