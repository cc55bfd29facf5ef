"""Fault tests on real processes that the hardening list implies: repeated kills, hangs, transient 500s.

Promise tested: request and semantic recovery under repeated faults. Every
stream completes token-identically to an unfaulted run; nothing is judged by
wall-clock time (a bounded loop of kills, then the token sequences).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from httpx_sse import connect_sse

from common import oneshot_http
from lifeline.processes import gateway_config
from tests.e2e.gateway.conftest import direct_tokens, parse_events, stream

MAX_TOKENS = 48
GREEDY = {"model": "tiny", "prompt": "When a region is lost the gateway", "max_tokens": MAX_TOKENS,
          "temperature": 0.0, "ignore_eos": True, "return_token_ids": True}
SEEDED = {**GREEDY, "temperature": 1.0, "top_p": 0.9, "seed": 77}
STREAMS = 8
KILLS = 3


@pytest.fixture(scope="module")
def cluster(cluster_factory):
    c = cluster_factory()
    # Retry budget at its defaults (min 3, ratio 0.2): the point is that they suffice.
    c.start_gateway(gateway_config(c.model, recovery={"stall_timeout": 1.0, "first_token_timeout": 60.0}))
    c.start_engine("steady", ["--fault-token-delay-ms", "40"])
    c.gateway.wait_routable("tiny", 1)
    return c


@pytest.fixture(scope="module")
def expected(cluster):
    steady = cluster.engines[0]
    return {name: direct_tokens(steady.url, cluster.model, body) for name, body in (("greedy", GREEDY), ("seeded", SEEDED))}


def _restart(cluster, instance_id: str, extra: list[str]):
    previous = cluster.gateway.leases().get(instance_id, 0)
    engine = cluster.start_engine(instance_id, extra)
    cluster.gateway.wait_generation_above(instance_id, previous)
    return engine


def test_eight_streams_survive_an_engine_killed_and_restarted_in_a_loop(cluster, expected):
    """Kill + restart one of two engines KILLS times while 8 clients stream back to back; none may fail."""
    extra = ["--fault-token-delay-ms", "40"]
    victim = _restart(cluster, "chaos", extra)
    stop = threading.Event()
    kills: list[int] = []

    def chaos() -> None:
        nonlocal victim
        for _ in range(KILLS):
            time.sleep(1.5)  # streams are on it by now (least-outstanding routing spreads them)
            victim.kill(signal.SIGKILL)
            kills.append(1)
            victim = _restart(cluster, "chaos", extra)
        stop.set()

    def client(i: int) -> list[tuple[str, object]]:
        name = "greedy" if i % 2 == 0 else "seeded"
        body = GREEDY if name == "greedy" else SEEDED
        results = []
        while not stop.is_set():
            results.append((name, stream(cluster.gateway.url, body)))
        return results

    before = cluster.gateway.metric("lifeline_gateway_migrations_total")
    killer = threading.Thread(target=chaos, daemon=True)
    killer.start()
    with ThreadPoolExecutor(STREAMS) as pool:
        runs = [r for rs in pool.map(client, range(STREAMS)) for r in rs]
    killer.join(timeout=300)
    assert len(kills) == KILLS
    failures = [(name, result.error) for name, result in runs if result.error is not None]
    assert failures == []
    for name, result in runs:
        assert result.token_ids == expected[name]
        assert result.seqs == list(range(len(result.seqs))) and result.done
    assert cluster.gateway.metric("lifeline_gateway_migrations_total") > before  # the kills did hit streams


def test_a_sigstopped_engine_is_left_when_its_lease_lapses_not_at_the_first_token_timeout(cluster_factory):
    c = cluster_factory()
    # The first-token wait is far longer than the test may take: only the lapsed lease can move the request.
    c.start_gateway(gateway_config(c.model, recovery={"stall_timeout": 600.0, "first_token_timeout": 600.0}))
    c.start_engine("ok")
    frozen = c.start_engine("frozen", ["--fault-first-token-delay-ms", "3000"])
    c.gateway.wait_routable("tiny", 2)
    expected = direct_tokens(c.engines[0].url, c.model, GREEDY)

    def freeze_soon() -> None:
        time.sleep(0.5)  # the request is in its (delayed) prefill on the frozen engine
        frozen.process.send_signal(signal.SIGSTOP)

    freezer = threading.Thread(target=freeze_soon, daemon=True)
    freezer.start()
    try:
        result = stream(c.gateway.url, GREEDY, {"X-Lifeline-Prefer-Instance": "frozen"}, timeout=120)
    finally:
        freezer.join()
        frozen.process.send_signal(signal.SIGCONT)
    assert result.error is None and result.token_ids == expected
    assert c.gateway.metric("lifeline_gateway_migrations_total", {"reason": "lease_lapsed"}) == 1


def test_one_transient_500_per_engine_does_not_empty_the_fleet(cluster_factory):
    c = cluster_factory()
    c.start_gateway(gateway_config(c.model))
    c.start_engine("a", ["--fault-fail-next-requests", "1"])
    c.start_engine("b", ["--fault-fail-next-requests", "1"])
    c.gateway.wait_routable("tiny", 2)
    results = []
    for instance in ("a", "b"):  # each engine answers its first request with a 500
        results.append(stream(c.gateway.url, {**GREEDY, "max_tokens": 8}, {"X-Lifeline-Prefer-Instance": instance}))
    expected = direct_tokens(c.engines[0].url, c.model, {**GREEDY, "max_tokens": 8})  # its one 500 is spent
    for result in results:
        assert result.error is None and result.token_ids == expected
    ready = oneshot_http.get(f"{c.gateway.url}/healthz/ready", timeout=5).json()
    assert ready["routable_endpoints"]["tiny"] == 2


def test_malformed_requests_leave_the_keep_alive_connection_usable(cluster, expected):
    with httpx.Client(base_url=cluster.gateway.url, timeout=60) as client:
        for raw in ('{"model": "tiny", "prompt": "\\ud800"}', '{"model": "tiny", "prompt": ' + "[" * 4000 + "]" * 4000 + "}"):
            response = client.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
            assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"
        assert client.get("/v1/completions").status_code == 405
        ok = client.post("/v1/completions", json={**GREEDY, "stream": False})
        assert ok.status_code == 200 and ok.json()["choices"][0]["token_ids"] == expected["greedy"]


def test_delete_ends_an_attached_client_with_a_typed_event(cluster):
    events = []
    with httpx.Client(timeout=60) as client, connect_sse(
        client, "POST", cluster.gateway.url + "/v1/completions", json={**GREEDY, "stream": True},
        headers={"X-Lifeline-Prefer-Instance": "steady"},
    ) as source:
        for sse in source.iter_sse():
            events.append((sse.id, sse.event, sse.data))
            if len(events) == 3:
                rid = json.loads(events[0][2])["lifeline"]["request_id"]
                assert oneshot_http.delete(f"{cluster.gateway.url}/v1/streams/{rid}", timeout=10).json()["cancelled"]
    assert events[-1][1] == "error"
    assert json.loads(events[-1][2])["error"]["type"] == "cancelled"
    assert [int(e[0]) for e in events] == list(range(len(events)))


def test_a_planned_engine_shutdown_migrates_without_the_retry_budget(cluster_factory):
    """SIGTERM: the engine drains and ends what is left with `engine_draining`; with a zero retry budget
    any other migration would fail, so a completed stream proves the drain spent no budget."""
    c = cluster_factory()
    c.start_gateway(gateway_config(c.model, recovery={"stall_timeout": 5.0},
                                   admission={"retry_budget_min": 0, "retry_budget_ratio": 0.0}))
    c.start_engine("stays", ["--fault-token-delay-ms", "40"])
    leaving = c.start_engine("leaving", ["--fault-token-delay-ms", "40", "--drain-unroute-wait", "0.2",
                                         "--drain-timeout", "0.3"])
    c.gateway.wait_routable("tiny", 2)
    expected = direct_tokens(c.engines[0].url, c.model, GREEDY)
    events = []
    with httpx.Client(timeout=120) as client, connect_sse(
        client, "POST", c.gateway.url + "/v1/completions", json={**GREEDY, "stream": True},
        headers={"X-Lifeline-Prefer-Instance": "leaving"},
    ) as source:
        for sse in source.iter_sse():
            events.append((sse.id, sse.event, sse.data))
            if len(events) == 3:
                leaving.process.send_signal(signal.SIGTERM)
    result = parse_events(events)
    assert result.error is None and result.token_ids == expected and result.done
    assert c.gateway.metric("lifeline_gateway_migrations_total", {"reason": "engine_draining"}) == 1
    leaving.wait_exit(timeout=60)


def test_a_huge_prompt_does_not_stall_streams_or_lease_renewals(cluster, expected):
    """A 3.5 MB prompt is tokenized off the event loop: a concurrent stream finishes without a stall
    migration, and the engine's lease renewals (TTL 2 s, through this gateway) never lapse, so its
    generation is unchanged. A 10 MB body is refused with 413 before it is read."""
    generation = cluster.gateway.leases()["steady"]
    outcome: dict[str, object] = {}

    def stream_meanwhile() -> None:
        outcome["result"] = stream(cluster.gateway.url, GREEDY, {"X-Lifeline-Prefer-Instance": "steady"})

    streamer = threading.Thread(target=stream_meanwhile)
    streamer.start()
    huge = {"model": "tiny", "prompt": "the standby region takes over " * 120_000, "max_tokens": 4}
    response = oneshot_http.post(f"{cluster.gateway.url}/v1/completions", json=huge, timeout=120)
    assert response.status_code == 400 and response.json()["error"]["param"] == "max_tokens"  # over the context
    streamer.join(timeout=120)
    result = outcome["result"]
    assert result.error is None and result.token_ids == expected["greedy"]
    assert set(result.epochs) == {0}  # never migrated: no stall
    assert cluster.gateway.leases()["steady"] == generation  # renewals kept going
    too_big = oneshot_http.post(f"{cluster.gateway.url}/v1/completions", content=b"x" * (10 * 1024 * 1024),
                                headers={"content-type": "application/json"}, timeout=60)
    assert too_big.status_code == 413 and too_big.json()["error"]["type"] == "request_too_large"
