"""Streams survive the serving engine dying: SIGKILL at every point of a stream.

Promise tested: semantic recovery. For greedy and seeded requests the client's
token sequence equals an unfaulted run's exactly, `seq` is contiguous from 0,
and exactly one migration is counted (the request epoch ends at 1).
"""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest

from tests.e2e.gateway.conftest import direct_tokens, stream
from lifeline.processes import gateway_config

MAX_TOKENS = 24
PROMPT = "The standby region takes over when"
GREEDY = {"model": "tiny", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True, "return_token_ids": True}
SEEDED = {**GREEDY, "temperature": 1.0, "top_p": 0.95, "seed": 4242}


@pytest.fixture(scope="module")
def cluster(cluster_factory):
    c = cluster_factory()
    c.start_gateway(gateway_config(c.model, recovery={"stall_timeout": 1.0}))
    c.start_engine("survivor")
    c.gateway.wait_routable("tiny", 1)
    return c


@pytest.fixture(scope="module")
def expected(cluster):
    survivor = cluster.engines[0]
    return {name: direct_tokens(survivor.url, cluster.model, body) for name, body in (("greedy", GREEDY), ("seeded", SEEDED))}


def migrations(cluster) -> float:
    return cluster.gateway.metric("lifeline_gateway_migrations_total")


def start_victim(cluster, extra_args: list[str]):
    for engine in cluster.engines:
        if engine.instance_id == "victim":
            engine.kill()  # one process per instance id; a new start gets a new generation
    previous = cluster.gateway.leases().get("victim", 0)
    victim = cluster.start_engine("victim", extra_args)
    cluster.gateway.wait_generation_above("victim", previous)
    return victim


def assert_continuous(result, expected_tokens: list[int]) -> None:
    assert result.error is None, result.error
    assert result.token_ids == expected_tokens
    assert result.seqs == list(range(len(result.seqs)))
    assert result.done and result.finish_reason == "length"


@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
@pytest.mark.parametrize("kill_after", [0, 1, MAX_TOKENS // 2, MAX_TOKENS - 1], ids=["before-first", "after-1", "mid", "at-last"])
def test_stream_survives_engine_kill(cluster, expected, sampling, kill_after):
    victim = start_victim(cluster, ["--fault-exit-after-tokens", str(kill_after)])
    before = migrations(cluster)
    body = GREEDY if sampling == "greedy" else SEEDED
    result = stream(cluster.gateway.url, body, {"X-Lifeline-Prefer-Instance": "victim"})
    victim.process.wait(timeout=30)
    assert victim.process.returncode == 137  # the fault really killed it
    assert_continuous(result, expected[sampling])
    assert migrations(cluster) - before == 1
    assert result.epochs[-1] == 1  # one compare-and-set advance
    served_by_victim = [c for c in result.chunks if c["lifeline"]["epoch"] == 0 and c["choices"] and c["choices"][0].get("token_ids")]
    assert len(served_by_victim) == kill_after


def test_stream_survives_sigkill_from_outside(cluster, expected):
    victim = start_victim(cluster, ["--fault-token-delay-ms", "60"])
    before = migrations(cluster)
    killed = threading.Event()
    events_seen: list[int] = []

    def kill_when_streaming() -> None:
        while len(events_seen) < 5:
            time.sleep(0.01)
        victim.kill(signal.SIGKILL)
        killed.set()

    killer = threading.Thread(target=kill_when_streaming, daemon=True)
    killer.start()
    # Count events as they arrive so the kill lands mid-stream.
    from httpx_sse import connect_sse

    from tests.e2e.gateway.conftest import parse_events

    events = []
    with httpx.Client(timeout=120) as client, connect_sse(
        client, "POST", cluster.gateway.url + "/v1/completions", json={**GREEDY, "stream": True},
        headers={"X-Lifeline-Prefer-Instance": "victim"},
    ) as source:
        for sse in source.iter_sse():
            events.append((sse.id, sse.event, sse.data))
            events_seen.append(1)
    killer.join(timeout=30)
    assert killed.is_set()
    result = parse_events(events)
    assert_continuous(result, expected["greedy"])
    assert migrations(cluster) - before == 1
    assert 5 <= sum(1 for c in result.chunks if c["lifeline"]["epoch"] == 0) < MAX_TOKENS


def test_hung_engine_stall_migrates(cluster, expected):
    start_victim(cluster, ["--fault-hang-after-tokens", "5"])
    before = cluster.gateway.metric("lifeline_gateway_migrations_total", {"reason": "stall"})
    result = stream(cluster.gateway.url, SEEDED, {"X-Lifeline-Prefer-Instance": "victim"})
    assert_continuous(result, expected["seeded"])
    assert cluster.gateway.metric("lifeline_gateway_migrations_total", {"reason": "stall"}) - before == 1


def test_engine_500_before_first_token_migrates(cluster, expected):
    start_victim(cluster, ["--fault-fail-next-requests", "1"])
    before = migrations(cluster)
    result = stream(cluster.gateway.url, GREEDY, {"X-Lifeline-Prefer-Instance": "victim"})
    assert_continuous(result, expected["greedy"])
    assert migrations(cluster) - before == 1


def test_fail_stop_ends_with_typed_error(cluster, expected):
    start_victim(cluster, ["--fault-exit-after-tokens", "3"])
    result = stream(cluster.gateway.url, GREEDY, {"X-Lifeline-Prefer-Instance": "victim", "X-Lifeline-Recovery": "fail_stop"})
    assert result.token_ids == expected["greedy"][:3]
    assert result.finish_reason == "error"
    assert result.error["type"] == "engine_failed"
    assert not result.done
    assert result.seqs == list(range(len(result.seqs)))


def test_retry_from_scratch_recomputes_and_skips_delivered_tokens(cluster, expected):
    start_victim(cluster, ["--fault-exit-after-tokens", "6"])
    before = cluster.gateway.metric("lifeline_gateway_recomputed_decode_tokens_total")
    result = stream(cluster.gateway.url, GREEDY, {"X-Lifeline-Prefer-Instance": "victim", "X-Lifeline-Recovery": "retry_from_scratch"})
    assert_continuous(result, expected["greedy"])
    assert cluster.gateway.metric("lifeline_gateway_recomputed_decode_tokens_total") - before == 6
