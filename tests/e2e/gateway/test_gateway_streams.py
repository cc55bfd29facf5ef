"""Generations, resume, cancellation, total loss and the official client, against real processes."""

from __future__ import annotations

import signal
import time

import openai
import pytest

from common import oneshot_http
from tests.e2e.gateway.conftest import direct_tokens, resume, stream
from lifeline.processes import LEASE_TOKEN, gateway_config, scrape_metric

BODY = {"model": "tiny", "prompt": "Leases lapse, generations grow", "max_tokens": 32, "temperature": 0.0,
        "ignore_eos": True, "return_token_ids": True}


@pytest.fixture(scope="module")
def cluster(cluster_factory):
    c = cluster_factory()
    c.start_gateway(gateway_config(c.model, recovery={"stall_timeout": 1.0, "max_migrations": 3}))
    c.start_engine("eng-a", ["--fault-token-delay-ms", "25"])
    c.start_engine("eng-b", ["--fault-token-delay-ms", "25"])
    c.gateway.wait_routable("tiny", 2)
    return c


@pytest.fixture(scope="module")
def expected(cluster):
    return direct_tokens(cluster.engines[0].url, cluster.model, BODY)


def engine(cluster, instance_id):
    return next(e for e in reversed(cluster.engines) if e.instance_id == instance_id)


def test_restarted_engine_gets_new_generation_and_old_one_is_rejected(cluster, expected):
    gw = cluster.gateway
    old = gw.leases()["eng-a"]
    a = engine(cluster, "eng-a")
    a.kill(signal.SIGKILL)
    a.start()
    a.wait_ready()
    new = gw.wait_generation_above("eng-a", old)
    assert oneshot_http.get(f"{a.url}/healthz/generation").json()["generation"] == new
    # A renewal carrying the old generation (a late message from the dead process) is refused.
    late = oneshot_http.put(f"{gw.url}/lifeline/v1/leases/eng-a", json={"generation": old}, headers={"Authorization": f"Bearer {LEASE_TOKEN}"})
    assert late.status_code == 409 and late.json()["error"]["type"] == "stale_generation"
    # The new generation is routed to.
    result = stream(gw.url, BODY, {"X-Lifeline-Prefer-Instance": "eng-a"})
    assert result.token_ids == expected and result.epochs[-1] == 0
    assert oneshot_http.get(f"{a.url}/v1/models").headers["x-lifeline-generation"] == str(new)


def test_lease_endpoint_requires_the_token(cluster):
    gw = cluster.gateway
    response = oneshot_http.post(f"{gw.url}/lifeline/v1/leases", json={"instance_id": "x", "url": "http://127.0.0.1:1", "version": cluster.model.name})
    assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"
    assert "x" not in gw.leases()


def test_resume_after_dropped_connection_with_last_event_id(cluster, expected):
    gw = cluster.gateway
    first = stream(gw.url, BODY, stop_after=6)  # hang up after six events
    assert first.seqs == list(range(6))
    time.sleep(0.3)  # let the gateway notice the hang-up and detach
    rest = resume(gw.url, first.request_id, last_event_id=first.seqs[-1])
    assert rest.seqs == list(range(6, 6 + len(rest.seqs)))  # every frame after 5, exactly once
    assert first.token_ids + rest.token_ids == expected
    assert rest.done and rest.finish_reason == "length"
    # Replaying a finished stream from the start gives the same frames again.
    replay = resume(gw.url, first.request_id, last_event_id=None)
    assert replay.token_ids == expected and replay.seqs == list(range(len(replay.seqs)))


def test_client_disconnect_stops_engine_generation(cluster):
    gw = cluster.gateway
    b = engine(cluster, "eng-b")

    def generated() -> float:
        return scrape_metric(f"{b.url}/metrics", "vllm:generation_tokens_total")

    before = generated()
    long_body = {**BODY, "max_tokens": 400}
    partial = stream(gw.url, long_body, {"X-Lifeline-Prefer-Instance": "eng-b"}, stop_after=4)
    assert len(partial.token_ids) == 4
    time.sleep(0.5)
    settled = generated()
    time.sleep(0.5)
    assert generated() == settled  # nothing more is being decoded
    assert settled - before < 400
    assert scrape_metric(f"{b.url}/metrics", "vllm:num_requests_running") == 0


def test_openai_client_works_unchanged(cluster, expected):
    client = openai.OpenAI(base_url=f"{cluster.gateway.url}/v1", api_key="unused", max_retries=0)
    text = oneshot_http.post(f"{cluster.engines[0].url}/v1/completions",
                             json={**BODY, "model": cluster.model.name}, timeout=60).json()["choices"][0]["text"]
    kwargs = {"model": "tiny", "prompt": BODY["prompt"], "max_tokens": 32, "temperature": 0.0, "extra_body": {"ignore_eos": True}}
    completion = client.completions.create(**kwargs)
    assert completion.choices[0].text == text and completion.usage.completion_tokens == 32
    streamed = "".join(chunk.choices[0].text for chunk in client.completions.create(**kwargs, stream=True) if chunk.choices)
    assert streamed == text
    models = [m.id for m in client.models.list()]
    assert models == ["tiny"]
    messages = [{"role": "user", "content": "Which region is primary?"}]
    chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0.0)
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=16, temperature=0.0, stream=True, stream_options={"include_usage": True}) if c.choices]
    assert "".join(pieces) == chat.choices[0].message.content
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=4)


def test_all_engines_dead_ends_with_typed_error(cluster_factory):
    c = cluster_factory()
    c.start_gateway(gateway_config(c.model, recovery={"stall_timeout": 1.0}))
    c.start_engine("doomed-a", ["--fault-exit-after-tokens", "3"])
    c.start_engine("doomed-b", ["--fault-exit-after-tokens", "0"])
    c.gateway.wait_routable("tiny", 2)
    result = stream(c.gateway.url, BODY, {"X-Lifeline-Prefer-Instance": "doomed-a", "X-Lifeline-Timeout-Ms": "60000"})
    assert len(result.token_ids) == 3
    assert result.finish_reason == "error" and not result.done
    assert result.error["type"] == "no_healthy_endpoint"  # not deadline_exceeded: it ended well before
    assert result.seqs == list(range(len(result.seqs)))
    # New requests are refused up front with 503 and Retry-After while nothing is routable.
    refused = oneshot_http.post(f"{c.gateway.url}/v1/completions", json=BODY, timeout=30)
    assert refused.status_code == 503 and refused.json()["error"]["type"] == "no_healthy_endpoint"
    assert "retry-after" in refused.headers


def test_deadline_too_close_ends_with_deadline_exceeded(cluster):
    c = cluster
    hung = c.start_engine("hung", ["--fault-hang-after-tokens", "2"])
    c.gateway.wait_generation_above("hung", 0)
    result = stream(c.gateway.url, BODY, {"X-Lifeline-Prefer-Instance": "hung", "X-Lifeline-Timeout-Ms": "1200"})
    hung.kill()
    assert len(result.token_ids) == 2
    assert result.error["type"] == "deadline_exceeded" and result.finish_reason == "error"
