"""Instance drills on stock vLLM: a real vLLM killed, and its engine core stopped, behind a real gateway.

The fleet is the drill's own `FileFleet` (what `lifeline drill run --fleet`
reads): a real vLLM (the victim, in zone z1, started again by its fleet
file's restart command) and a reference engine (the survivor, in z2), both
leased by the regional agent from its probes, a gateway that routes by that
registry and ships its routing events to a served control plane, where the
runner records the run. A stream moved off vLLM continues on the reference
engine, so both drills also cross engines: greedy and seeded streams must
come back token-identical (Lifeline's sampler is loaded in vLLM).

- `sigkill` takes vLLM's process group (API server and engine core); the
  restart command brings it back and the agent leases it again.
- `sigstop` stops the engine core alone: vLLM's API server keeps answering
  `/health` 200 (seen while the drill ran) and its streams go silent; the
  gateway moves them, the agent ejects the wedged engine, SIGCONT undoes it.
- A fault that needs the reference engine's fault admin is refused with the
  typed reason before the vLLM is touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from common import oneshot_http
from common.clock import SystemClock
from common.vllm_processes import engine_processes
from controlplane.db import session_scope
from controlplane.drill import service
from controlplane.drill.errors import FaultNotInjectable
from controlplane.drill.fleet import FileFleet, FleetFile
from controlplane.drill.runner import HttpEventReader, InstanceDrillRunner
from controlplane.drill.schemas import DrillSpec
from controlplane.drill.states import DrillRunState
from lifeline.processes import EngineProcess, GatewayProcess, built_model, free_port, gateway_config
from lifeline.vllm import VllmProcess, vllm_environment
from tests.support.served_controlplane import ControlPlane, served_controlplane
from tests.support.waiting import wait_for
from warm_pool.probe import record_canary

REDIS_URL = "redis://127.0.0.1:6379/0"
REGION = "r-vllm-drill"
SERVED = "tiny"
# Long enough that the fault lands mid-stream however fast this machine's vLLM decodes (CI's finished 160-token
# streams before the stop took, so the drill measured only streams that started after it).
TRAFFIC = {"requests": 4, "concurrency": 2, "max_tokens": 400, "fault_after_tokens": 6}
CANARY_PROMPT = [11, 12, 13, 14, 15, 16]


@dataclass
class DrillFleet:
    controlplane: ControlPlane
    fleet: FileFleet
    gateway: GatewayProcess
    victim_pid_file: Path
    workdir: Path

    def victim_pid(self) -> int:
        return int(self.victim_pid_file.read_text())

    def wait_both_routable(self) -> None:
        self.gateway.wait_routable(SERVED, 2, timeout=300)


def restart_command(server: VllmProcess, pid_file: Path) -> list[str]:
    """How the fleet file brings the victim back: vLLM's own command line, its pid written where kills look."""
    environment = {k: v for k, v in vllm_environment().items() if os.environ.get(k) != v}
    launch = shlex.join(["env", *(f"{k}={v}" for k, v in environment.items()), *server.command()])
    return ["sh", "-c", f"echo $$ > {shlex.quote(str(pid_file))}; exec {launch} >> "
                        f"{shlex.quote(str(server.log_path))} 2>&1"]


@pytest.fixture(scope="module")
def drill_fleet(module_vllm_factory: Any, tiny_model: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[DrillFleet]:
    workdir = tmp_path_factory.mktemp("vllm-drill")
    pid_file = workdir / "victim.pid"
    with served_controlplane(workdir) as controlplane, contextlib.ExitStack() as stack:
        victim = module_vllm_factory(SERVED, shutdown_timeout=1.0, wait_ready=False)  # starts beside the survivor
        pid_file.write_text(str(victim.process.pid))
        survivor = EngineProcess(tiny_model, free_port(), "survivor", workdir / "survivor-state",
                                 workdir / "survivor.log", extra_args=["--served-model-name", SERVED])
        survivor.start()
        stack.callback(survivor.kill)
        survivor.wait_ready()
        victim.wait_ready()
        prefix = f"test-{uuid.uuid4().hex[:8]}"
        # The canary the agent holds every engine to: recorded from the victim, through /v1/completions alone
        _, canary = asyncio.run(record_canary(victim.url, CANARY_PROMPT, max_tokens=6, max_ttft_s=30.0))
        (workdir / "canaries.json").write_text(json.dumps({SERVED: canary.model_dump(mode="json")}))
        config = workdir / "agent.yaml"
        config.write_text(yaml.safe_dump({
            "registry_prefix": prefix, "lease_ttl": 5.0, "probe_interval": 0.25, "probe_timeout": 3.0,
            "canary_file": str(workdir / "canaries.json"), "controlplane_url": controlplane.url,
            "controlplane_token": controlplane.tokens["agent"],
            "renew_leases_for": [
                {"url": victim.url, "instance_id": "victim", "version": SERVED, "zone": "z1"},
                {"url": survivor.url, "instance_id": "survivor", "version": SERVED, "zone": "z2"}]}))
        with open(workdir / "agent.log", "ab") as agent_log:
            agent = subprocess.Popen([sys.executable, "-m", "lifeline.cli", "agent", "serve", "--region", REGION,
                                      "--config", str(config), "--registry", REDIS_URL],
                                     stdout=agent_log, stderr=subprocess.STDOUT)
        stack.callback(lambda: (agent.terminate(), agent.wait(30)))
        gateway = GatewayProcess(gateway_config(tiny_model, alias=SERVED, version=SERVED, region=REGION, registry={
            "kind": "redis", "url": REDIS_URL, "key_prefix": prefix, "refresh_interval": 0.1, "ttl": 2.0},
            recovery={"stall_timeout": 2.0, "first_token_timeout": 10.0, "connect_timeout": 1.0},
            routing={"controlplane_url": controlplane.url, "token": controlplane.tokens["gateway"],
                     "event_flush_interval": 0.1}), free_port(), workdir, replica_id="gw-vllm-drill")
        gateway.start()
        stack.callback(gateway.kill)
        stack.callback(_kill_group, pid_file)  # the restarted victim is the fleet's, not the factory's
        fleet = FileFleet(FleetFile.model_validate({
            "gateway_url": gateway.url, "region": REGION, "ready_timeout_s": 300, "instances": {
                "victim": {"url": victim.url, "served_model": SERVED, "zone": "z1", "engine": "vllm",
                           "pid_file": str(pid_file), "restart": restart_command(victim, pid_file),
                           "bad_version": restart_command(VllmProcess(
                               model=built_model("tiny", 1), port=victim.port, served_model_name=SERVED,
                               log_path=workdir / "victim-bad-version.log", shutdown_timeout=1.0), pid_file)},
                "survivor": {"url": survivor.url, "served_model": SERVED, "zone": "z2"}}}))
        gateway.wait_live()
        drill = DrillFleet(controlplane, fleet, gateway, pid_file, workdir)
        drill.wait_both_routable()
        yield drill


def _kill_group(pid_file: Path) -> None:
    with contextlib.suppress(ProcessLookupError, ValueError, OSError):
        pid = int(pid_file.read_text())
        os.killpg(pid, signal.SIGCONT)
        os.killpg(pid, signal.SIGKILL)


TARGETS = {"request_rto_s": 60.0, "token_rpo_tokens": 0, "rto_quality_s": 300.0}


def define(drill: DrillFleet, fault: str, targets: dict[str, Any] = TARGETS, **traffic: Any) -> int:
    spec = DrillSpec.model_validate({
        "name": f"vllm-{fault}-{uuid.uuid4().hex[:6]}", "model": SERVED, "scope": "instance", "fault": fault,
        "blast_radius": {"region": REGION, "instances": ["victim"], "max_instances": 1},
        "stop_conditions": {"max_error_rate": 0.5},
        "targets": targets, "traffic": {**TRAFFIC, **traffic}})
    with session_scope(drill.controlplane.factory) as session:
        definition = service.define(session, spec=spec, actor="test", clock=SystemClock())
        return service.create_run(session, definition=definition, trigger="manual", actor="test",
                                  clock=SystemClock()).id


def runner(drill: DrillFleet) -> InstanceDrillRunner:
    return InstanceDrillRunner(factory=drill.controlplane.factory, fleet=drill.fleet, clock=SystemClock(),
                               events=HttpEventReader(drill.controlplane.url, drill.controlplane.tokens["viewer"]),
                               report_dir=drill.workdir / "reports")


def assert_passed_token_identical(outcome: Any) -> dict[str, Any]:
    report = outcome.report
    assert outcome.state == DrillRunState.PASSED, report["follow_ups"]
    assert (report["measured"]["token_rpo_tokens"], report["measured"]["requests_lost"]) == (0, 0)
    assert report["migrated_streams"] >= 1, "the fault must land mid-stream and the gateway move the streams"
    assert report["measured"]["request_rto_s"] is not None and report["measured"]["rto_quality_s"] is not None
    assert "l7" in report["routing_tiers_in_order"]
    assert report["engines"]["instances"]["victim"] == {"engine": "vllm", "sampling": "position_keyed"}
    assert report["fault_generation"] is None  # stock vLLM does not report one
    md, js, _ = (Path(p) for p in report["files"])
    assert "## RTO measured vs target" in md.read_text() and js.exists()
    return report


def test_a_sigkill_drill_on_vllm_passes_token_identical_and_the_restart_command_brings_it_back(
        drill_fleet: DrillFleet) -> None:
    drill_fleet.wait_both_routable()
    before = drill_fleet.victim_pid()
    [core, *_] = engine_processes(before)
    outcome = runner(drill_fleet).run(define(drill_fleet, "sigkill"))
    assert_passed_token_identical(outcome)
    assert not psutil.pid_exists(core.pid) or core.status() == psutil.STATUS_ZOMBIE  # the core died with it
    assert drill_fleet.victim_pid() != before and psutil.pid_exists(drill_fleet.victim_pid())
    drill_fleet.wait_both_routable()  # the agent leased the restarted vLLM again


def test_a_sigstop_drill_stops_vllms_engine_core_while_its_api_answers_and_sigcont_undoes_it(
        drill_fleet: DrillFleet) -> None:
    drill_fleet.wait_both_routable()
    server = psutil.Process(drill_fleet.victim_pid())
    core, *workers = engine_processes(server.pid)
    url = drill_fleet.fleet.engine_url("victim")
    seen: list[tuple[str, int]] = []  # (core state, /health status) while the drill runs
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            state = core.status()
            try:
                health = oneshot_http.get(f"{url}/health", timeout=2.0).status_code
            except httpx.HTTPError:
                health = 0
            seen.append((state, health))
            done.wait(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        outcome = runner(drill_fleet).run(define(drill_fleet, "sigstop"))
    finally:
        done.set()
        watcher.join(10)
    assert_passed_token_identical(outcome)
    assert (psutil.STATUS_STOPPED, 200) in seen, f"the core never seen stopped under a healthy API: {seen[-10:]}"
    # SIGCONT, not a restart: the same processes, running again, and leased again.
    assert server.pid == drill_fleet.victim_pid()
    assert all(p.status() != psutil.STATUS_STOPPED for p in [server, core, *workers])
    drill_fleet.wait_both_routable()


def test_a_bad_version_drill_on_vllm_measures_the_canary_catching_other_weights_under_the_same_name(
        drill_fleet: DrillFleet) -> None:
    """The victim started again from tiny-seed1's weights, still serving `tiny`: healthy, ready and fast. The
    agent's canary refuses it the lease; the drill reads that verdict back from the event log, counts what was
    served wrong, and redeploys the right version."""
    drill_fleet.wait_both_routable()
    before = drill_fleet.victim_pid()
    # No request RTO target: the streams move at the redeploy's kill, before the wrong build is up (the stamp)
    targets = {"token_rpo_tokens": 0, "rto_quality_s": 300.0}
    outcome = runner(drill_fleet).run(define(drill_fleet, "bad_version", targets, fault_duration_s=4.0))
    report = outcome.report
    assert outcome.state == DrillRunState.PASSED, report["follow_ups"]
    measured = report["measured"]
    assert measured["canary_detection_s"] is not None and 0 <= measured["canary_detection_s"] < 10
    verdict = report["fault_details"]["verdict"]
    assert verdict["actor"].startswith("agent:") and "canary" in verdict["reason"]
    # the admission canary judged it before any lease: nothing was served from the wrong weights
    assert (measured["wrong_answers"], measured["token_rpo_tokens"], measured["requests_lost"]) == (0, 0, 0)
    assert measured["rto_quality_s"] is not None  # the right version back, answering the undisturbed tokens
    assert drill_fleet.victim_pid() != before
    drill_fleet.wait_both_routable()


@pytest.mark.parametrize(("fault", "traffic", "says"), [
    ("hang", {}, "a decode hang"),
    ("sigkill", {"token_delay_ms": 40.0}, "token_delay_ms=40"),
])
def test_what_needs_the_fault_admin_is_refused_before_the_vllm_is_touched(
        drill_fleet: DrillFleet, fault: str, traffic: dict[str, Any], says: str) -> None:
    pid = drill_fleet.victim_pid()
    run_id = define(drill_fleet, fault, **traffic)
    with pytest.raises(FaultNotInjectable, match=says):
        runner(drill_fleet).run(run_id)
    with session_scope(drill_fleet.controlplane.factory) as session:
        run = service.get_run_or_raise(session, run_id=run_id)
        assert run.state == "aborted" and run.abort_reason.startswith("refused") and run.started_at is None
    assert drill_fleet.victim_pid() == pid
    assert wait_for(lambda: oneshot_http.get(drill_fleet.fleet.engine_url("victim") + "/health", timeout=5).status_code
                    == 200, "the untouched vLLM answers")
