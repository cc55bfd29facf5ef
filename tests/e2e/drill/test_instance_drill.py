"""Instance drills on the local fleet: real engines killed and hung behind a real gateway.

Promise measured: request and semantic recovery. A SIGKILL drill, and a
SIGSTOP drill undone by SIGCONT, pass with every greedy and seeded stream
token-identical to the undisturbed run, the gateway's `l7` event read back
from the control plane, and the report exported; a stop condition tripped on purpose aborts the drill and rolls the
hang back; a target outside the blast radius is refused before anything is
touched.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from common.clock import SystemClock
from common import oneshot_http
from controlplane.db import session_scope
from controlplane.drill import service
from controlplane.drill.errors import OutsideBlastRadius
from controlplane.drill.runner import HttpEventReader, InstanceDrillRunner
from controlplane.drill.schemas import DrillSpec
from controlplane.drill.states import DrillRunState
from tests.e2e.drill.conftest import faults

CLEAR = {"exit_after_tokens": None, "hang_after_tokens": None, "token_delay_ms": 0.0, "first_token_delay_ms": 0.0,
         "fail_next_requests": 0, "corrupt_weights": False}


def define(controlplane, **overrides) -> int:
    body = {"name": "kill-victim", "model": "tiny", "scope": "instance", "fault": "sigkill",
            "blast_radius": {"region": "local", "instances": ["victim"], "max_instances": 1},
            "stop_conditions": {"max_error_rate": 0.5},
            "targets": {"request_rto_s": 30.0, "token_rpo_tokens": 0, "rto_quality_s": 120.0},
            "traffic": {"requests": 4, "concurrency": 2, "max_tokens": 24, "fault_after_tokens": 6,
                        "token_delay_ms": 40.0}}
    spec = DrillSpec.model_validate({**body, **overrides})
    clock = SystemClock()
    with session_scope(controlplane.factory) as session:
        definition = service.define(session, spec=spec, actor="test", clock=clock)
        return service.create_run(session, definition=definition, trigger="manual", actor="test", clock=clock).id


def runner(controlplane, fleet, tmp_path: Path) -> InstanceDrillRunner:
    return InstanceDrillRunner(factory=controlplane.factory, fleet=fleet, clock=SystemClock(),
                               events=HttpEventReader(controlplane.url, controlplane.tokens["viewer"]),
                               report_dir=tmp_path / "reports")


def slo_figures(controlplane) -> dict[str, dict]:
    response = oneshot_http.get(f"{controlplane.url}/api/v1/slo/tiny", headers=controlplane.headers("viewer"), timeout=10)
    assert response.status_code == 200, response.text
    return {f["metric"]: f for entry in response.json()["triple"] for f in entry["figures"]}


def test_slo_export_goes_from_unverified_to_measured_after_a_drill_run_through_the_api(
        controlplane, fleet, tmp_path):
    # First in the module: no drill has run on this control plane yet.
    drill_runner = runner(controlplane, fleet, tmp_path)
    controlplane.app.state.drill_dispatch = drill_runner.run  # the in-process dispatcher (embedded default)
    before = slo_figures(controlplane)
    assert {f["status"] for f in before.values()} == {"unverified"}
    body = {"name": "weekly-kill", "model": "tiny", "scope": "instance", "fault": "sigkill",
            "blast_radius": {"region": "local", "instances": ["victim"]},
            "targets": {"request_rto_s": 30.0, "token_rpo_tokens": 0, "rto_quality_s": 120.0},
            "traffic": {"requests": 4, "concurrency": 2, "max_tokens": 24, "fault_after_tokens": 6,
                        "token_delay_ms": 40.0}}
    api = httpx.Client(base_url=controlplane.url, headers=controlplane.headers("operator"), timeout=30)
    assert api.post("/api/v1/drills", json=body).status_code == 201
    run = api.post("/api/v1/drills/weekly-kill/runs").json()
    assert run["state"] == "scheduled"
    deadline = time.monotonic() + 240
    while (run := api.get(f"/api/v1/drills/runs/{run['id']}").json())["state"] not in ("passed", "failed",
                                                                                         "aborted"):
        assert time.monotonic() < deadline, run
        time.sleep(0.5)
    assert run["state"] == "passed", run["failure"]
    after = slo_figures(controlplane)
    for metric in ("request_rto_s", "token_rpo_tokens", "rto_quality_s"):
        assert (after[metric]["status"], after[metric]["run_id"]) == ("measured", run["id"]), after[metric]
        assert after[metric]["measured"] == run["report"]["measured"][metric]
    assert after["rpo_context_tokens"]["status"] == "unverified"  # an instance drill does not measure it
    markdown = oneshot_http.get(f"{controlplane.url}/api/v1/slo/tiny", params={"format": "md"},
                                headers=controlplane.headers("viewer"), timeout=10).text
    assert f"(run {run['id']}, weekly-kill v1)" in markdown


def test_sigkill_drill_passes_token_identical_and_reports(controlplane, fleet, tmp_path):
    run_id = define(controlplane)
    generation_before = fleet.gateway.leases()["victim"]
    outcome = runner(controlplane, fleet, tmp_path).run(run_id)
    report = outcome.report
    assert outcome.state == DrillRunState.PASSED, report["follow_ups"]
    assert report["measured"]["token_rpo_tokens"] == 0
    assert report["measured"]["requests_lost"] == 0
    assert report["migrated_streams"] >= 1  # the fault landed mid-stream and the gateway moved it
    assert report["measured"]["request_rto_s"] is not None
    assert report["measured"]["rto_quality_s"] is not None
    assert report["measured"]["detection_s"] is not None
    assert "l7" in report["routing_tiers_in_order"]
    # Rolled back: the victim serves again, as a newer generation.
    assert fleet.gateway.leases()["victim"] > generation_before
    md, js, png = (Path(p) for p in report["files"])
    assert "## RTO measured vs target" in md.read_text()
    assert json.loads(js.read_text())["run"] == run_id
    assert png.read_bytes()[:4] == b"\x89PNG"
    with session_scope(controlplane.factory) as session:
        run = service.get_run_or_raise(session, run_id=run_id)
        assert run.state == "passed" and run.report["measured"]["token_rpo_tokens"] == 0
        assert run.fault_target == "victim"


def test_a_sigstop_drill_moves_the_stalled_streams_token_identical_and_the_continued_engine_serves_again(
        controlplane, fleet, tmp_path):
    run_id = define(controlplane, name="stop-victim", fault="sigstop")
    victim_pid = fleet.engines["victim"].process.pid
    outcome = runner(controlplane, fleet, tmp_path).run(run_id)
    report = outcome.report
    assert outcome.state == DrillRunState.PASSED, report["follow_ups"]
    assert (report["measured"]["token_rpo_tokens"], report["measured"]["requests_lost"]) == (0, 0)
    assert report["migrated_streams"] >= 1  # stalled mid-stream, moved by the gateway's stall timeout
    assert "l7" in report["routing_tiers_in_order"]
    # Rolled back by SIGCONT, not a restart: the same process, running, routable again.
    assert fleet.engines["victim"].process.pid == victim_pid
    assert "State:\tT" not in Path(f"/proc/{victim_pid}/status").read_text()
    fleet.gateway.wait_routable("tiny", 2)


def test_stop_condition_tripped_on_purpose_aborts_and_rolls_back(controlplane, fleet, tmp_path):
    # A TTFT p99 bound of 1 µs: the first finished request crosses it, with the hang in place.
    run_id = define(controlplane, name="hang-victim", fault="hang",
                    stop_conditions={"max_error_rate": None, "ttft_p99_ms": 0.001, "min_requests": 1},
                    traffic={"requests": 6, "concurrency": 2, "max_tokens": 16, "fault_after_tokens": 0})
    survivor_pid = fleet.engines["survivor"].process.pid
    outcome = runner(controlplane, fleet, tmp_path).run(run_id)
    assert outcome.state == DrillRunState.ABORTED
    assert outcome.report["aborted"].startswith("TTFT p99")
    assert outcome.report["requests"] < 6  # traffic stopped early
    victim_faults = faults(fleet.engine_url("victim"))
    assert {k: victim_faults[k] for k in CLEAR} == CLEAR  # the hang was rolled back
    assert fleet.engines["survivor"].process.poll() is None and fleet.engines["survivor"].process.pid == survivor_pid
    with session_scope(controlplane.factory) as session:
        run = service.get_run_or_raise(session, run_id=run_id)
        assert run.state == "aborted" and run.abort_reason.startswith("stop condition: TTFT p99")


def test_target_outside_the_blast_radius_is_refused_untouched(controlplane, fleet, tmp_path):
    run_id = define(controlplane, name="kill-victim-only")
    survivor = fleet.engines["survivor"]
    before = faults(survivor.url)
    with pytest.raises(OutsideBlastRadius):
        runner(controlplane, fleet, tmp_path).run(run_id, target="survivor")
    assert survivor.process.poll() is None
    assert faults(survivor.url) == before
    with session_scope(controlplane.factory) as session:
        run = service.get_run_or_raise(session, run_id=run_id)
        assert run.state == "aborted" and run.abort_reason.startswith("refused")
        assert run.started_at is None


def test_an_operator_abort_through_the_api_stops_the_drill_and_rolls_back(controlplane, fleet, tmp_path):
    run_id = define(controlplane, name="hang-long", fault="hang", stop_conditions={"max_error_rate": None},
                    traffic={"requests": 200, "concurrency": 2, "max_tokens": 16, "fault_after_tokens": 0})
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.update(result=runner(controlplane, fleet, tmp_path).run(run_id)))
    thread.start()
    api = httpx.Client(base_url=controlplane.url, headers=controlplane.headers("operator"), timeout=30)
    deadline = time.monotonic() + 120
    while api.get(f"/api/v1/drills/runs/{run_id}").json()["state"] != "running" or \
            faults(fleet.engine_url("victim"))["hang_after_tokens"] is None:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    aborted = api.post(f"/api/v1/drills/runs/{run_id}/abort", json={"reason": "customer escalation"})
    assert aborted.status_code == 200 and aborted.json()["state"] == "aborted"
    thread.join(timeout=120)
    assert not thread.is_alive()
    result = outcome["result"]
    assert result.state == DrillRunState.ABORTED
    assert result.report["aborted"] == "aborted by an operator: customer escalation"
    assert result.report["requests"] < 200
    victim_faults = faults(fleet.engine_url("victim"))
    assert {k: victim_faults[k] for k in CLEAR} == CLEAR  # the hang was rolled back
