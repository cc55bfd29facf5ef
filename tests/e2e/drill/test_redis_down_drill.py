"""A Redis-down drill: the region's lease-registry / token-log Redis stops answering under streams in flight.

Real processes: a private redis-server (SIGSTOPped by the drill, never the
shared one), a gateway whose lease registry and token log both live on it,
two engines. Promise measured, only what docs/gateway.md ("When Redis is
away") makes: streams in flight continue token-identically (none lost);
the lease view fails static; frames are held in the gateway and flushed
when Redis answers again; a new stream during the outage is refused with
503 `token_log_unavailable`.
"""

from __future__ import annotations

from common.clock import SystemClock
from controlplane.db import session_scope
from controlplane.drill import service
from controlplane.drill.runner import DrillRunner, HttpEventReader
from controlplane.drill.schemas import DrillSpec
from controlplane.drill.states import DrillRunState


def test_streams_in_flight_survive_a_silent_redis_as_documented(controlplane, redis_fleet, tmp_path):
    spec = DrillSpec.model_validate({
        "name": "redis-silent", "model": "tiny", "scope": "region", "fault": "redis_down",
        "blast_radius": {"region": "local"}, "stop_conditions": {"max_error_rate": 0.5},
        "targets": {"token_rpo_tokens": 0},
        "traffic": {"requests": 2, "concurrency": 2, "max_tokens": 48, "fault_after_tokens": 6,
                    "token_delay_ms": 40.0, "fault_duration_s": 3.0}})
    clock = SystemClock()
    with session_scope(controlplane.factory) as session:
        definition = service.define(session, spec=spec, actor="test", clock=clock)
        run_id = service.create_run(session, definition=definition, trigger="manual", actor="test", clock=clock).id
        service.approve(session, run_id=run_id, actor="operator:alice", clock=clock)
    outcome = DrillRunner(factory=controlplane.factory, fleet=redis_fleet, clock=clock,
                          events=HttpEventReader(controlplane.url, controlplane.tokens["viewer"]),
                          report_dir=tmp_path / "reports").run(run_id)
    report, measured, details = outcome.report, outcome.report["measured"], outcome.report["fault_details"]
    assert outcome.state == DrillRunState.PASSED, report["follow_ups"]
    assert measured["requests_lost"] == 0 and measured["token_rpo_tokens"] == 0
    assert report["requests_during_fault"] == 2  # both streams were in flight across the outage
    assert measured["redis_down_s"] >= 3.0
    assert "fail_static" in details["lease_view_modes_seen"]
    assert details["token_log_unavailable_seen"]
    assert measured["frames_held_max"] > 0 and measured["frames_flushed"] > 0
    assert "token_log_unavailable" in details["new_stream_during_outage"]
    assert details["new_stream_answered_at_s"] < measured["redis_down_s"]  # refused while Redis was away
    assert measured["stores_back_s"] is not None
    assert redis_fleet.gateway.metric("lifeline_gateway_token_log_available") == 1
    with session_scope(controlplane.factory) as session:
        assert service.get_run_or_raise(session, run_id=run_id).fault_target == "redis:local"
