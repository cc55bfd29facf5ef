"""SIGKILL of a real control-plane process mid-cutover: `execute` or `rollback` finishes it after a restart.

The process is the control plane's own app (`controlplane.app.create_app`,
served by uvicorn as `lifeline controlplane serve` does), started with a
tier whose state is files (`FileTierDriver`) and whose verification can be
held, so the kill lands after the step's before-state was recorded and its
change written, before it verified. Real time: the dead runner's claim
(1 s + the step's 2 s timeout) must lapse before another process takes over.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from common import oneshot_http
from controlplane.auth import service as auth_service
from controlplane.auth.roles import Role
from controlplane.db import session_scope
from cutover import service as cutover_service
from lifeline.processes import free_port, scrape_metric, wait_for_http_ok
from tests.integration.cutover.test_cutover_support import (  # noqa: F401 - fixtures
    topology_two_regions,
)

pytestmark = [pytest.mark.usefixtures("topology_two_regions"), pytest.mark.long]

ROOT = Path(__file__).resolve().parents[3]
PREFIX = "203.0.113.0/24"

LAUNCHER = """
import dataclasses, json, sys
from datetime import timedelta
import uvicorn
from controlplane.app import create_app
from controlplane.config import ControlPlaneSettings
from cutover.policy import CutoverPolicy
from tests.integration.cutover.test_cutover_support import FileTierDriver

url, port, root = sys.argv[1], int(sys.argv[2]), sys.argv[3]
app = create_app(ControlPlaneSettings(database_url=url, port=port))
runtime = app.state.cutover_runtime
app.state.cutover_runtime = dataclasses.replace(
    runtime, drivers=[*runtime.drivers, FileTierDriver(root, {"region:eu": [%r]})],
    policy=CutoverPolicy(claim_ttl=timedelta(seconds=1), min_wait=timedelta(0)))
uvicorn.run(app, host="127.0.0.1", port=port, log_config=None)
""" % PREFIX


class ControlPlane:
    def __init__(self, database_url: str, root: Path, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.process = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, database_url, str(self.port), str(root)],
            cwd=ROOT, stdout=log_path.open("wb"), stderr=subprocess.STDOUT,
        )
        wait_for_http_ok(f"{self.url}/healthz/live", self.process, name="control plane", log_path=log_path,
                         timeout=60)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


@pytest.fixture
def processes(database_url: str, tmp_path: Path) -> Iterator[Any]:
    started: list[ControlPlane] = []

    def start(name: str) -> ControlPlane:
        plane = ControlPlane(database_url, tmp_path, tmp_path / f"{name}.log")
        started.append(plane)
        return plane

    yield start
    for plane in started:
        plane.kill()


@pytest.fixture
def operator(session_factory: Any) -> dict[str, str]:
    from common.clock import SystemClock

    with session_scope(session_factory) as session:
        _, secret = auth_service.create_token(session, name="crash-op", role=Role.OPERATOR, created_by="test",
                                              clock=SystemClock())
    return {"Authorization": f"Bearer {secret}"}


def kill_mid_step(processes: Any, operator: dict[str, str], tmp_path: Path, session_factory: Any) -> int:
    (tmp_path / "hold").write_text("")
    first = processes("first")
    plan = {"scope": {"kind": "region", "region": "eu"}, "tier": "anycast", "reason": "eu degraded",
            "step_timeout_s": 2}
    cutover_id = oneshot_http.post(f"{first.url}/api/v1/cutovers", json=plan, headers=operator, timeout=30).json()["id"]

    def execute() -> None:
        try:
            oneshot_http.post(f"{first.url}/api/v1/cutovers/{cutover_id}/execute", json={"idempotency_key": "k1"},
                              headers=operator, timeout=60)
        except httpx.HTTPError:
            pass  # the process is killed under it

    caller = threading.Thread(target=execute, daemon=True)
    caller.start()
    deadline = time.monotonic() + 30
    while not (tmp_path / "verifying").exists():
        assert time.monotonic() < deadline, first.log_path.read_text()[-2000:]
        time.sleep(0.05)
    first.kill()
    caller.join(timeout=10)
    (tmp_path / "hold").unlink()
    assert (tmp_path / PREFIX.replace("/", "_")).read_text() == "withdrawn"  # the change reached the tier
    with session_scope(session_factory) as session:
        left = cutover_service.get_or_raise(session, cutover_id=cutover_id)
        assert left.state == "executing"
        assert [(s.status, s.actual_before.announced) for s in left.steps] == [("applying", True)]
    return cutover_id


def poll(call: Any, until: Any, *, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        response = call()
        if until(response):
            return response
        if time.monotonic() >= deadline:
            shown = f"{response.status_code} {response.text}" if isinstance(response, httpx.Response) else response
            raise AssertionError(f"{what}: last answer {shown}")
        time.sleep(0.25)


def test_execute_completes_a_cutover_whose_process_was_sigkilled_mid_step(
    processes: Any, operator: dict[str, str], tmp_path: Path, session_factory: Any
) -> None:
    cutover_id = kill_mid_step(processes, operator, tmp_path, session_factory)
    second = processes("second")

    def cutovers(name: str, **labels: str) -> float:  # the new process's /metrics, read from the database
        return scrape_metric(f"{second.url}/metrics", name, {"tier": "anycast", **labels})

    # What LifelineCutoverUnclaimed reads: mid-way, and the dead runner's claim has lapsed.
    poll(lambda: cutovers("lifeline_controlplane_cutovers_unclaimed"), lambda n: n == 1, what="unclaimed")
    assert cutovers("lifeline_controlplane_cutovers", state="executing") == 1
    url = f"{second.url}/api/v1/cutovers/{cutover_id}/execute"
    done = poll(lambda: oneshot_http.post(url, json={"idempotency_key": "k1"}, headers=operator, timeout=30),
                lambda r: r.status_code == 200 and r.json()["state"] == "completed", what="resume")
    assert [s["status"] for s in done.json()["steps"]] == ["verified"]
    assert cutovers("lifeline_controlplane_cutovers_unclaimed") == 0
    assert (cutovers("lifeline_controlplane_cutovers", state="executing"),
            cutovers("lifeline_controlplane_cutovers", state="completed")) == (0, 1)
    events = oneshot_http.get(f"{second.url}/api/v1/events", params={"scope": "region:eu"}, headers=operator).json()
    kinds = [e["kind"] for e in events]
    assert kinds.count("cutover.resumed") == 1 and kinds.count("cutover.step") == 1
    again = oneshot_http.post(url, json={"idempotency_key": "k1"}, headers=operator, timeout=30).json()
    assert again["revision"] == done.json()["revision"]


def test_rollback_undoes_a_cutover_whose_process_was_sigkilled_mid_step(
    processes: Any, operator: dict[str, str], tmp_path: Path, session_factory: Any
) -> None:
    cutover_id = kill_mid_step(processes, operator, tmp_path, session_factory)
    second = processes("second")
    url = f"{second.url}/api/v1/cutovers/{cutover_id}/rollback"
    back = poll(lambda: oneshot_http.post(url, json={"reason": "abandon after crash"}, headers=operator, timeout=30),
                lambda r: r.status_code == 200, what="rollback")
    assert back.json()["state"] == "rolled_back"
    assert (tmp_path / PREFIX.replace("/", "_")).read_text() == "announced"
    reverts = oneshot_http.get(f"{second.url}/api/v1/events", params={"kind": "cutover.rollback_step"},
                               headers=operator).json()
    assert [(e["outcome"], e["reason"]) for e in reverts] == [("succeeded", "abandon after crash")]
    assert [s["status"] for s in back.json()["steps"]] == ["reverted"]
