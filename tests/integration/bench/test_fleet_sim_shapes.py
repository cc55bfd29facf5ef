"""The fleet simulator's engines answer what a real reference engine answers, on every path gateways and agents use.

A real `lifeline engine serve` and one simulated engine are asked the same
requests; each answer is reduced to its shape (keys, and the type of each
value), and the shapes must be equal. The values differ where the model is
simulated (token ids, text) and where each engine is itself (ids, times).
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from bench.fleet_sim import SimulatedFleet, create_app
from warm_pool.probe import IN_FLIGHT_GAUGES

PROMPT = [5, 6, 7, 8]
COMPLETION = {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "ignore_eos": True, "return_token_ids": True}


def shape(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: shape(item) for key, item in sorted(value.items())}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


def sse_chunks(text: str) -> list[Any]:
    data = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(item) for item in data[:-1]]


@pytest.fixture
def simulated() -> Any:
    fleet = SimulatedFleet.spread(1, base_url="http://testserver", regions=["r1"], zones=["a"],
                                  versions={"tiny": "sha256:" + "0" * 64},
                                  redis=aioredis.Redis(), key_prefix="unused", ttl=timedelta(seconds=2))
    with TestClient(create_app(fleet, renew=False)) as client:
        yield client, "/e/" + next(iter(fleet.engines))


@pytest.fixture
def reference(engine_factory: Any) -> str:
    return engine_factory("reference-0").url


@pytest.mark.parametrize("path", ["/healthz/live", "/healthz/ready", "/healthz/generation", "/v1/models"])
def test_a_probe_or_identity_answer_has_the_reference_engines_shape(simulated: Any, reference: str, path: str) -> None:
    client, prefix = simulated
    real = httpx.get(reference + path, timeout=10)
    fake = client.get(prefix + path)
    assert fake.status_code == real.status_code == 200
    assert shape(fake.json()) == shape(real.json())


def test_metrics_carry_the_gauges_and_counters_the_agent_reads(simulated: Any, reference: str) -> None:
    client, prefix = simulated

    def families(text: str) -> dict[str, str]:
        return {f.name: f.type for f in text_string_to_metric_families(text) if f.name.startswith("vllm:")}

    real, fake = families(httpx.get(reference + "/metrics", timeout=10).text), families(client.get(prefix + "/metrics").text)
    assert set(IN_FLIGHT_GAUGES) <= set(fake)
    assert fake == {name: kind for name, kind in real.items() if name in fake}


def test_a_streamed_completion_has_the_reference_engines_chunks_with_a_token_id_each(
        simulated: Any, reference: str) -> None:
    client, prefix = simulated
    real = httpx.post(reference + "/v1/completions", json={**COMPLETION, "stream": True}, timeout=30)
    fake = client.post(prefix + "/v1/completions", json={**COMPLETION, "stream": True})
    assert fake.headers["content-type"].startswith("text/event-stream")
    real_chunks, fake_chunks = sse_chunks(real.text), sse_chunks(fake.text)
    assert len(fake_chunks) == len(real_chunks) == 3
    assert [shape(c) for c in fake_chunks] == [shape(c) for c in real_chunks]
    assert [c["choices"][0]["finish_reason"] for c in fake_chunks] == [None, None, "length"]
    assert all(len(c["choices"][0]["token_ids"]) == 1 for c in fake_chunks)
    assert fake.headers["x-lifeline-generation"]


def test_a_whole_completion_has_the_reference_engines_body_and_the_same_tokens_every_time(
        simulated: Any, reference: str) -> None:
    client, prefix = simulated
    real = httpx.post(reference + "/v1/completions", json=COMPLETION, timeout=30).json()
    fake = client.post(prefix + "/v1/completions", json=COMPLETION).json()
    assert shape(fake) == shape(real)
    assert fake["prompt_token_ids"] == PROMPT
    assert client.post(prefix + "/v1/completions", json=COMPLETION).json()["choices"][0]["token_ids"] == \
        fake["choices"][0]["token_ids"]
