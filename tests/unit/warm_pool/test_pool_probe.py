"""Probe verdicts from scripted engine answers (httpx.MockTransport), one row per way an engine can be wrong."""

from __future__ import annotations

import json

import httpx
import pytest

from common.clock import ManualClock
from contract.canary import CanaryRecord
from warm_pool.probe import Prober, Verdict, judge_canary

IDENTITY = {"instance_id": "e1", "generation": 3, "boot_generation": 2, "model": "v2", "weights_digest": "sha256:aa",
            "zone": "z1", "region": "r1", "started_at": 0.0}
RECORD = CanaryRecord(prompt_token_ids=[1, 2, 3], output_token_ids=[7, 8, 9, 10], max_ttft_s=0.5)


def engine(overrides: dict[str, httpx.Response | Exception]) -> httpx.MockTransport:
    defaults = {
        "/healthz/live": httpx.Response(200, json={"status": "live"}),
        "/healthz/ready": httpx.Response(200, json={"status": "ready"}),
        "/healthz/generation": httpx.Response(200, json=IDENTITY),
    }

    def handler(request: httpx.Request) -> httpx.Response:
        answer = {**defaults, **overrides}.get(request.url.path, httpx.Response(404))
        if isinstance(answer, Exception):
            raise answer
        return answer

    return httpx.MockTransport(handler)


@pytest.mark.parametrize(("name", "overrides", "versions", "digests", "verdict"), [
    ("healthy", {}, frozenset({"v2"}), {"v2": "sha256:aa"}, Verdict.OK),
    ("no snapshot yet: no generation check", {}, None, None, Verdict.OK),
    ("live times out", {"/healthz/live": httpx.ReadTimeout("slow")}, None, None, Verdict.TIMEOUT),
    ("connection refused", {"/healthz/live": httpx.ConnectError("refused")}, None, None, Verdict.ERROR),
    ("live 500", {"/healthz/live": httpx.Response(500)}, None, None, Verdict.ERROR),
    ("draining", {"/healthz/ready": httpx.Response(503, json={"status": "not_ready", "engine_status": "draining"})},
     None, None, Verdict.DRAINING),
    ("partitioned is not ready", {"/healthz/ready": httpx.Response(503, json={"engine_status": "partitioned"})},
     None, None, Verdict.ERROR),
    ("overloaded", {"/healthz/ready": httpx.Response(429, json={"error": {"type": "overloaded"}})},
     None, None, Verdict.OVERLOADED),
    ("superseded version", {}, frozenset({"v3"}), None, Verdict.OLD_GENERATION),
    ("bytes not the catalog's", {}, frozenset({"v2"}), {"v2": "sha256:bb"}, Verdict.WRONG_OUTPUT),
    ("generation body garbage", {"/healthz/generation": httpx.Response(200, json={"x": 1})}, None, None, Verdict.ERROR),
    ("stock vLLM: /health only", {"/healthz/live": httpx.Response(404), "/health": httpx.Response(200)},
     frozenset({"v2"}), None, Verdict.OK),
    ("stock vLLM down", {"/healthz/live": httpx.Response(404), "/health": httpx.Response(500)}, None, None, Verdict.ERROR),
])
async def test_health_verdicts(name, overrides, versions, digests, verdict) -> None:
    async with httpx.AsyncClient(transport=engine(overrides)) as client:
        result = await Prober(client, clock=ManualClock()).health("http://e1", expected_versions=versions,
                                                                  expected_digests=digests)
    assert result.verdict is verdict, (name, result.reason)


@pytest.mark.parametrize(("tokens", "ttft", "verdict", "reason"), [
    ([7, 8, 9, 10], 0.1, Verdict.OK, "as recorded"),
    ([7, 8, 9], 0.1, Verdict.WRONG_OUTPUT, "3 tokens, recorded 4"),
    ([7, 8, 4, 10], 0.1, Verdict.WRONG_OUTPUT, "token 2 is 4, recorded 9"),
    ([7, 8, 9, 10], 0.9, Verdict.OVERLOADED, "first token after 0.900 s"),
])
def test_canary_judgement(tokens, ttft, verdict, reason) -> None:
    result = judge_canary(RECORD, tokens, ttft)
    assert (result.verdict, reason in result.reason) == (verdict, True)


def test_canary_compares_only_the_stable_prefix_when_told() -> None:
    lenient = RECORD.model_copy(update={"compare_tokens": 2})
    assert judge_canary(lenient, [7, 8, 0, 0], 0.1).verdict is Verdict.OK
    assert judge_canary(lenient, [7, 0, 9, 10], 0.1).verdict is Verdict.WRONG_OUTPUT


def sse(*chunks: dict | str) -> bytes:
    return b"".join(f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n".encode() for c in chunks)


@pytest.mark.parametrize(("response", "verdict"), [
    (httpx.Response(200, headers={"content-type": "text/event-stream"},
                    content=sse(*({"choices": [{"token_ids": [t]}]} for t in [7, 8, 9, 10]), "[DONE]")), Verdict.OK),
    (httpx.Response(200, headers={"content-type": "text/event-stream"},
                    content=sse(*({"choices": [{"token_ids": [t]}]} for t in [8, 8, 9, 10]), "[DONE]")),
     Verdict.WRONG_OUTPUT),
    (httpx.Response(200, headers={"content-type": "text/event-stream"},
                    content=sse({"choices": [{"token_ids": [7]}]}, {"error": {"type": "engine_draining"}})),
     Verdict.DRAINING),
    (httpx.Response(429, json={"error": {"type": "overloaded"}}), Verdict.OVERLOADED),
    (httpx.Response(503, json={"error": {"type": "engine_draining"}}), Verdict.DRAINING),
    (httpx.Response(500, json={"error": {"type": "internal"}}), Verdict.ERROR),
    (httpx.ReadTimeout("stalled"), Verdict.TIMEOUT),
])
async def test_canary_over_the_wire(response, verdict) -> None:
    sent = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        if isinstance(response, Exception):
            raise response
        return response

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        result = await Prober(client, clock=ManualClock()).canary("http://e1", model="v2", record=RECORD)
    assert result.verdict is verdict, result.reason
    assert sent[0] | {"prompt": None} == {"model": "v2", "prompt": None, "max_tokens": 4, "temperature": 0.0,
                                          "ignore_eos": True, "return_token_ids": True, "stream": True}
    assert sent[0]["prompt"] == [1, 2, 3]


VLLM_METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 3.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 9.0
vllm:time_to_first_token_seconds_count{model_name="m"} 9.0
vllm:time_to_first_token_seconds_sum{model_name="m"} 1.5
"""


@pytest.mark.parametrize(("name", "answer", "in_flight"), [
    ("vLLM's gauges, summed over their labels", httpx.Response(200, text=VLLM_METRICS), 7),
    ("the reference engine's, unlabelled", httpx.Response(200, text="# TYPE vllm:num_requests_running gauge\n"
     "vllm:num_requests_running 0.0\n# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0.0\n"), 0),
    ("one gauge missing: cannot say it is idle",
     httpx.Response(200, text="# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0.0\n"), None),
    ("no /metrics", httpx.Response(404), None),
    ("not Prometheus text", httpx.Response(200, text="vllm:num_requests_running zero\nvllm:num_requests_waiting 0\n"),
     None),
    ("unreachable", httpx.ConnectError("refused"), None),
])
async def test_in_flight_is_running_plus_waiting_from_the_engines_metrics(name, answer, in_flight) -> None:
    prober = Prober(httpx.AsyncClient(transport=engine({"/metrics": answer})), clock=ManualClock())
    assert await prober.in_flight("http://e1") == in_flight, name
