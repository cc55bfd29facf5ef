"""The demo's control-plane-down drill, run in its own process: `python -m lifeline.demo.cp_outage FLEET SECONDS REGION`.

Why not through the API: a drill that silences the control plane's API
process cannot be run by that process (the drill refuses a fleet whose
control plane is the runner's own, docs/drills.md), and the embedded
default runs drill tasks in-process. So this process is the runner, as the
CLI or a Celery worker would be: it defines the drill, requests a run,
approves it as the demo's operator (a region drill needs a person's
approval), runs it on the fleet file (SIGSTOP the API the gateways poll for
SECONDS, SIGCONT) and prints the run's report as JSON.

It records the run in the control plane's own database, so the run is
evidence in the SLO document the demo exports, like every other drill.
On SQLite that needs one care: the API process must not be stopped inside
a write transaction, or it would hold SQLite's one write lock for the
whole outage and lock the runner out. `QuiescedPause` takes the write lock
itself first (`BEGIN IMMEDIATE` waits for a write in progress to commit),
SIGSTOPs the API while holding it, waits until every thread of it shows
stopped, and lets it go: the API is stopped
holding no write lock (at most a WAL read snapshot, which blocks no
writer), and a write it was about to begin waits for SIGCONT.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

NAME = "demo-controlplane-down"


class QuiescedPause:
    """The fleet's control-plane handle, paused only while this process holds the SQLite database's write lock."""

    def __init__(self, handle: Any, database: Path | None) -> None:
        self.handle = handle
        self.database = database

    def __getattr__(self, name: str) -> Any:  # url, token, pid: the wrapped handle's
        return getattr(self.handle, name)

    def pause(self) -> None:
        if self.database is None:  # PostgreSQL: a stopped session holds row locks at most, never the database
            self.handle.pause()
            return
        connection = sqlite3.connect(self.database, timeout=30.0, isolation_level=None)
        try:
            connection.execute("BEGIN IMMEDIATE")
            self.handle.pause()
            _wait_stopped(self.handle.pid)  # SIGSTOP lands asynchronously, thread by thread: all, before we let go
        finally:
            connection.execute("ROLLBACK")
            connection.close()

    def resume(self) -> None:
        self.handle.resume()


def _wait_stopped(pid: int, timeout: float = 5.0) -> None:
    """Until every thread of `pid` shows stopped (T) in /proc; a process that went away counts as stopped."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except FileNotFoundError:
            return
        states = []
        for task in tasks:
            try:
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:
                continue  # that thread exited meanwhile
        if all(state in ("T", "t") for state in states):
            return
        time.sleep(0.005)
    raise TimeoutError(f"process {pid} did not stop within {timeout:g} s of SIGSTOP")


def sqlite_path(url: str) -> Path | None:
    return Path(url.split("///", 1)[1]) if url.startswith("sqlite") and "///" in url else None


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
    assert fleet.spec.events is not None and fleet.controlplane is not None  # the demo writes them
    fleet.controlplane = QuiescedPause(fleet.controlplane, sqlite_path(settings.resolved_database_url()))
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
