"""A control-plane-down drill: the API the gateways poll stops answering while traffic flows (invariant 7).

Real processes: `lifeline controlplane serve` (its own SQLite), a gateway
routing by its snapshot, an engine, a Redis lease registry. The runner
records the run in another control plane (the `controlplane` fixture), so
SIGSTOPping the fleet's never stops the drill. Promise measured: the data
plane outlives the control plane — no request lost, streams token-identical,
the gateway ready throughout on the snapshot it had applied before the
outage, and reconciled once the control plane answers again.
"""

from __future__ import annotations

import threading
import time

import pytest

from common.clock import SystemClock
from common import oneshot_http
from controlplane.db import session_scope
from controlplane.drill import service
from controlplane.drill.runner import DrillRunner, HttpEventReader
from controlplane.drill.schemas import DrillSpec
from controlplane.drill.states import DrillRunState


def test_gateways_serve_on_the_last_good_snapshot_while_the_control_plane_is_silent(
        controlplane, snapshot_fleet, tmp_path):
    spec = DrillSpec.model_validate({
        "name": "controlplane-silent", "model": "tiny", "scope": "region", "fault": "controlplane_down",
        "blast_radius": {"region": "local"}, "stop_conditions": {"max_error_rate": 0.5},
        "targets": {"token_rpo_tokens": 0},
        "traffic": {"requests": 4, "concurrency": 2, "max_tokens": 16, "fault_after_tokens": 4,
                    "fault_duration_s": 3.0}})
    clock = SystemClock()
    with session_scope(controlplane.factory) as session:
        definition = service.define(session, spec=spec, actor="test", clock=clock)
        run_id = service.create_run(session, definition=definition, trigger="manual", actor="test", clock=clock).id
        service.approve(session, run_id=run_id, actor="operator:alice", clock=clock)  # a region drill
    fleet_cp = snapshot_fleet.snap.controlplane
    cp_pid = fleet_cp.process.pid
    outcome = DrillRunner(factory=controlplane.factory, fleet=snapshot_fleet, clock=clock,
                          events=HttpEventReader(fleet_cp.url, snapshot_fleet.viewer_token),
                          report_dir=tmp_path / "reports").run(run_id)
    report, measured = outcome.report, outcome.report["measured"]
    assert outcome.state == DrillRunState.PASSED, report["follow_ups"]
    assert measured["requests_lost"] == 0 and measured["token_rpo_tokens"] == 0
    assert measured["controlplane_down_s"] >= 3.0
    assert report["requests_during_fault"] >= 2  # traffic kept flowing through the outage
    assert measured["gateways_not_ready"] == 0 and report["fault_details"]["ready_probes"] >= 2
    gateway = report["fault_details"]["gateways"]["gw-snap"]
    assert gateway["kept_last_good_snapshot"] and gateway["reconciled"]
    assert gateway["snapshot_version_after"] == gateway["snapshot_version_before"]
    assert measured["last_good_snapshot_s"] >= measured["controlplane_down_s"]
    assert 0 <= measured["reconcile_s"] <= measured["last_good_snapshot_s"]
    assert report["routing_tiers_in_order"] == []  # nothing had to act: the data plane rode it out
    # The same process, running again (SIGCONT, not a restart) and answering.
    assert fleet_cp.process.pid == cp_pid and fleet_cp.process.poll() is None
    assert oneshot_http.get(f"{fleet_cp.url}/healthz/ready", timeout=5).status_code == 200
    with session_scope(controlplane.factory) as session:
        run = service.get_run_or_raise(session, run_id=run_id)
        assert (run.state, run.fault_target) == ("passed", "controlplane:local")
    # The fleet's own SLO document, from its catalog and this gateway's live report: one region, no standby.
    slo = oneshot_http.get(f"{fleet_cp.url}/api/v1/slo/tiny", timeout=10,
                           headers={"Authorization": f"Bearer {snapshot_fleet.viewer_token}"}).json()
    weight = next(f for e in slo["triple"] for f in e["figures"] if f["metric"] == "rpo_weight_versions")
    assert weight["status"] == "unverified" and "there is no standby" in weight["why"], weight


def _state(pid: int) -> str:
    """The process state letter from /proc (T: stopped by a signal)."""
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]


def test_an_operator_abort_mid_outage_resumes_the_control_plane(controlplane, snapshot_fleet, tmp_path):
    spec = DrillSpec.model_validate({
        "name": "controlplane-silent-long", "model": "tiny", "scope": "region", "fault": "controlplane_down",
        "blast_radius": {"region": "local"}, "stop_conditions": {"max_error_rate": 0.5},
        "traffic": {"requests": 2, "concurrency": 2, "max_tokens": 16, "fault_after_tokens": 0,
                    "fault_duration_s": 120.0}})
    clock = SystemClock()
    with session_scope(controlplane.factory) as session:
        definition = service.define(session, spec=spec, actor="test", clock=clock)
        run_id = service.create_run(session, definition=definition, trigger="manual", actor="test", clock=clock).id
        service.approve(session, run_id=run_id, actor="operator:alice", clock=clock)
    pid = snapshot_fleet.snap.controlplane.process.pid
    outcome: dict = {}
    drill = DrillRunner(factory=controlplane.factory, fleet=snapshot_fleet, clock=clock)
    thread = threading.Thread(target=lambda: outcome.update(result=drill.run(run_id)))
    thread.start()
    deadline = time.monotonic() + 60
    while _state(pid) != "T":  # the drill stopped it
        assert time.monotonic() < deadline and thread.is_alive(), "the control plane was never stopped"
        time.sleep(0.05)
    with session_scope(controlplane.factory) as session:  # the runner's own database answers throughout
        service.abort(session, run_id=run_id, reason="customer escalation", actor="operator:alice", clock=clock)
    thread.join(timeout=90)
    assert not thread.is_alive()
    result = outcome["result"]
    assert result.state == DrillRunState.ABORTED
    assert result.report["aborted"] == "aborted by an operator: customer escalation"
    assert result.report["measured"]["controlplane_down_s"] < 60  # cleared at the abort, not after 120 s
    assert _state(pid) != "T"
    assert oneshot_http.get(f"{snapshot_fleet.snap.cp_url}/healthz/ready", timeout=10).status_code == 200


def test_a_control_plane_that_does_not_answer_before_the_drill_is_refused_untouched(
        controlplane, snapshot_fleet, tmp_path):
    import dataclasses
    import subprocess
    import sys

    from controlplane.drill.errors import UnsupportedDrill
    from controlplane.drill.faults import PidHandle
    from lifeline.processes import free_port

    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # what it would stop
    try:
        class Elsewhere(type(snapshot_fleet)):  # the same fleet, its control plane named at a port nobody serves
            @property
            def controlplane(self):
                return PidHandle(f"http://127.0.0.1:{free_port()}", lambda: bystander.pid, token="t")

        fleet = Elsewhere(**{f.name: getattr(snapshot_fleet, f.name) for f in dataclasses.fields(snapshot_fleet)})
        spec = DrillSpec.model_validate({"name": "controlplane-elsewhere", "model": "tiny", "scope": "region",
                                         "fault": "controlplane_down", "blast_radius": {"region": "local"}})
        clock = SystemClock()
        with session_scope(controlplane.factory) as session:
            definition = service.define(session, spec=spec, actor="test", clock=clock)
            run_id = service.create_run(session, definition=definition, trigger="manual", actor="test",
                                        clock=clock).id
            service.approve(session, run_id=run_id, actor="operator:alice", clock=clock)
        with pytest.raises(UnsupportedDrill, match="does not answer before the drill"):
            DrillRunner(factory=controlplane.factory, fleet=fleet, clock=clock).run(run_id)
        assert _state(bystander.pid) != "T"
        with session_scope(controlplane.factory) as session:
            run = service.get_run_or_raise(session, run_id=run_id)
            assert run.state == "aborted" and run.abort_reason.startswith("refused") and run.started_at is None
    finally:
        bystander.kill()
        bystander.wait()
