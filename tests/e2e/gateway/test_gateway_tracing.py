"""One migrated stream is one trace: the client's span, the gateway's stream span, and both engine attempts.

A real gateway process with tracing on exports by OTLP/HTTP to a receiver in
this test (the OpenTelemetry protobuf, decoded with opentelemetry-proto: what
a collector gets). The victim engine exits after 5 tokens; the stream moves
to the survivor. The client sends its own W3C `traceparent`: the gateway's
spans join that trace, the failed attempt says why it failed, and each
engine logs the trace id of the attempt that reached it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from lifeline.processes import gateway_config
from tests.e2e.gateway.conftest import direct_tokens, stream
from tests.support.otlp import TraceReceiver
from tests.support.waiting import wait_for

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
BODY = {"model": "tiny", "prompt": "One trace, two engines", "max_tokens": 16, "temperature": 0.0,
        "ignore_eos": True, "return_token_ids": True}


@pytest.fixture(scope="module")
def receiver() -> Iterator[TraceReceiver]:
    r = TraceReceiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def cluster(cluster_factory, receiver: TraceReceiver):
    c = cluster_factory()
    c.start_gateway(gateway_config(c.model, recovery={"stall_timeout": 1.0}, tracing={
        "enabled": True, "otlp_endpoint": receiver.url, "export_interval": 0.2}))
    c.start_engine("survivor")
    c.gateway.wait_routable("tiny", 1)
    return c


def test_a_migrated_stream_is_one_trace_with_both_engine_attempts(cluster, receiver: TraceReceiver) -> None:
    expected = direct_tokens(cluster.engines[0].url, cluster.model, BODY)
    victim = cluster.start_engine("victim", ["--fault-exit-after-tokens", "5"])
    cluster.gateway.wait_routable("tiny", 2)
    result = stream(cluster.gateway.url, BODY, {"X-Lifeline-Prefer-Instance": "victim",
                                                "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
    assert result.error is None and result.token_ids == expected and result.epochs[-1] == 1

    def ours() -> list[dict[str, Any]] | None:
        spans = receiver.in_trace(CLIENT_TRACE)
        return spans if len(spans) >= 3 else None

    spans = wait_for(ours, "the stream's spans exported", timeout=30, interval=0.1)
    [root] = [s for s in spans if s["name"] == "gateway stream"]
    attempts = sorted((s for s in spans if s["name"] == "engine attempt"), key=lambda s: s["attributes"]["lifeline.epoch"])
    assert root["parent"] == CLIENT_SPAN  # the client's trace, continued
    assert root["attributes"]["lifeline.request_id"] == result.chunks[0]["lifeline"]["request_id"]
    assert (root["attributes"]["lifeline.outcome"], root["attributes"]["lifeline.migrations"]) == ("finished", 1)
    assert [a["attributes"]["lifeline.instance"] for a in attempts] == ["victim", "survivor"]
    assert all(a["parent"] == root["span_id"] for a in attempts)
    failed, moved = attempts
    assert failed["status"] == 2 and failed["attributes"]["lifeline.failure"]  # STATUS_CODE_ERROR, with its reason
    assert moved["status"] != 2 and moved["attributes"]["lifeline.epoch"] == 1
    victim.process.wait(timeout=30)
    for engine, attempt in ((victim, failed), (cluster.engines[0], moved)):
        lines = [json.loads(line) for line in engine.log_path.read_text().splitlines() if line.startswith("{")]
        accepted = [line for line in lines if line.get("msg") == "request accepted"
                    and line.get("request_id") == attempt["attributes"]["lifeline.attempt_id"]]
        assert accepted and accepted[0]["trace_id"] == CLIENT_TRACE, engine.instance_id


def test_tracing_off_sends_no_traceparent_and_exports_nothing(cluster_factory, receiver: TraceReceiver) -> None:
    c = cluster_factory()
    c.start_gateway(gateway_config(c.model))
    engine = c.start_engine("plain")
    c.gateway.wait_routable("tiny", 1)
    before = len(receiver.spans)
    result = stream(c.gateway.url, BODY, {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
    assert result.error is None
    lines = [json.loads(line) for line in engine.log_path.read_text().splitlines() if line.startswith("{")]
    accepted = [line for line in lines if line.get("msg") == "request accepted"]
    assert accepted and all("trace_id" not in line for line in accepted)
    assert len(receiver.spans) == before
