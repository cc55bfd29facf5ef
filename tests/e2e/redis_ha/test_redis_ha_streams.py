"""Streams behind a gateway whose lease registry and token log are a Sentinel-watched Redis, under Redis faults.

Real processes throughout: a Redis primary, two replicas and three sentinels
(`RedisSentinelLab`), two reference engines renewing their leases in that
Redis (`redis+sentinel://` URL), one gateway with both stores there. The
faults are the primary SIGKILLed (a failover), every Redis node SIGKILLed
for 10 s and restarted from its AOF, and every Redis node SIGSTOPped (a
silent Redis). Streams are greedy, so every one must be token-identical to
the engine's unfaulted answer. Nothing asserts wall-clock time; the measured
interruption is `bench/redis_failover.py`'s (docs/benchmarks.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from common import oneshot_http
from common.redis_url import redis_client
from contract.lease import RedisLeaseReader
from lifeline.daemons import RedisSentinelLab
from lifeline.processes import EngineProcess, GatewayProcess, built_model, free_port, gateway_config
from tests.e2e.gateway.conftest import direct_tokens, stream

BODY = {"model": "tiny", "prompt": "Redis fails over under a stream", "max_tokens": 120, "temperature": 0.0,
        "ignore_eos": True, "return_token_ids": True}
CLIENTS = 8


class Stack:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.model = built_model("tiny", 0)
        self.lab = RedisSentinelLab(workdir / "redis").start()
        config = gateway_config(
            self.model,
            registry={"kind": "redis", "url": self.lab.url, "ttl": 2.0, "token": "t"},
            token_log={"kind": "redis", "url": self.lab.url, "owner_ttl": 2.0},
            recovery={"stall_timeout": 10.0, "first_token_timeout": 20.0, "connect_timeout": 1.0},
            admission={"max_concurrency_per_engine": 8, "max_queue": 16},
        )
        self.gateway = GatewayProcess(config, free_port(), workdir, replica_id="gw-ha")
        self.engines: list[EngineProcess] = []
        self.gateway.start()
        self.gateway.wait_live()
        for name in ("eng-a", "eng-b"):
            engine = EngineProcess(self.model, free_port(), name, workdir / "state" / name, workdir / f"{name}.log",
                                   extra_args=["--registry", self.lab.url, "--fault-token-delay-ms", "30"])
            self.engines.append(engine)
            engine.start()
        for engine in self.engines:
            engine.wait_ready()
        self.gateway.wait_routable("tiny", 2)
        self.expected = direct_tokens(self.engines[0].url, self.model, BODY)

    def close(self) -> None:
        for engine in self.engines:
            engine.kill()
        self.gateway.kill()
        self.lab.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    built = Stack(tmp_path_factory.mktemp("redis-ha"))
    try:
        yield built
    finally:
        built.close()


class GenerationWatch:
    """Polls the registry through the control plane's reader; every generation seen, per instance, in order."""

    def __init__(self, url: str) -> None:
        self.reader = RedisLeaseReader(redis_client(url))
        self.seen: dict[str, list[int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                leases = self.reader.list_instances("local")
            except Exception:  # noqa: BLE001,S112 - Redis away; the next poll may answer
                continue
            for lease in leases:
                gens = self.seen.setdefault(lease.instance_id, [])
                if not gens or gens[-1] != lease.generation:
                    gens.append(lease.generation)

    def stop(self) -> dict[str, list[int]]:
        self._stop.set()
        self._thread.join(5)
        self.reader.redis.close()
        return self.seen


def _clients(stack: Stack, n: int = CLIENTS):
    pool = ThreadPoolExecutor(n)
    return pool, [pool.submit(stream, stack.gateway.url, BODY, timeout=120) for _ in range(n)]


def _post(stack: Stack) -> httpx.Response:
    return oneshot_http.post(f"{stack.gateway.url}/v1/completions", json={**BODY, "max_tokens": 4}, timeout=30)


def _wait_answering(stack: Stack, within: float = 60.0) -> httpx.Response:
    deadline = time.monotonic() + within
    while True:
        response = _post(stack)
        if response.status_code == 200 or time.monotonic() > deadline:
            return response
        time.sleep(0.2)


def _steady(stack: Stack) -> int:
    """Every Redis node up and synced, all sentinels agreeing, both engines routable: each test starts here."""
    for node in stack.lab.nodes:
        if not node.alive():
            node.start()  # Sentinel makes it a replica of the current primary
    primary = stack.lab.wait_settled()
    stack.gateway.wait_routable("tiny", 2)
    return primary


def _assert_identical(stack: Stack, results) -> None:
    for result in results:
        assert result.error is None, result.error
        assert result.done and result.finish_reason == "length"
        assert result.token_ids == stack.expected
        assert result.seqs == list(range(len(result.seqs)))  # each frame once, in order


def test_primary_sigkill_under_eight_streams_every_stream_identical_no_generation_reused(stack: Stack) -> None:
    old = _steady(stack)
    watch = GenerationWatch(stack.lab.url)
    pool, futures = _clients(stack)
    time.sleep(1.0)  # streams under way
    stack.lab.node(old).kill()
    stack.lab.wait_for_failover(old)
    results = [f.result(timeout=180) for f in futures]
    pool.shutdown()
    _assert_identical(stack, results)

    stack.gateway.wait_routable("tiny", 2)  # routing recovers: both engines registered again
    assert _wait_answering(stack).status_code == 200
    new = stack.lab.wait_settled()  # on a loaded machine Sentinel may retry the election on another replica
    assert new != old
    ready = oneshot_http.get(f"{stack.gateway.url}/healthz/ready", timeout=10).json()
    assert ready["redis"]["token_log"]["address"] == f"127.0.0.1:{new}"
    assert ready["redis"]["token_log"]["role"] == "master"
    seen = watch.stop()
    assert set(seen) == {"eng-a", "eng-b"}
    for gens in seen.values():
        assert gens == sorted(set(gens)), seen  # never one seen before, never going back
    assert stack.gateway.metric("lifeline_gateway_token_log_flushed_frames_total") > 0
    _steady(stack)  # the killed primary back as a replica: the lab has two again


def test_redis_stopped_for_ten_seconds_in_flight_streams_complete_new_requests_get_503(stack: Stack) -> None:
    _steady(stack)
    pool, futures = _clients(stack, 4)
    time.sleep(1.0)
    nodes = list(stack.lab.nodes)
    for node in nodes:
        node.kill()
    stopped_at = time.monotonic()
    refused = _post(stack)
    assert refused.status_code == 503
    assert refused.json()["error"]["type"] == "token_log_unavailable"
    assert refused.headers.get("Retry-After")
    time.sleep(max(0.0, 10.0 - (time.monotonic() - stopped_at)))
    for node in nodes:
        node.start()
    results = [f.result(timeout=180) for f in futures]
    pool.shutdown()
    _assert_identical(stack, results)
    assert _wait_answering(stack).status_code == 200  # everything resumes
    stack.gateway.wait_routable("tiny", 2)


def test_silent_redis_sigstop_times_out_instead_of_hanging(stack: Stack) -> None:
    _steady(stack)
    pool, futures = _clients(stack, 4)
    time.sleep(1.0)
    nodes = list(stack.lab.nodes)
    for node in nodes:
        node.pause()
    try:
        refused = _post(stack)  # bounded by the 1 s socket timeout, not by httpx's 30 s
        assert refused.status_code == 503
        assert refused.json()["error"]["type"] == "token_log_unavailable"
        ready = oneshot_http.get(f"{stack.gateway.url}/healthz/ready", timeout=10).json()
        assert ready["redis"]["token_log"]["reachable"] is False
        time.sleep(3.0)
    finally:
        for node in nodes:
            node.resume()
    results = [f.result(timeout=180) for f in futures]
    pool.shutdown()
    _assert_identical(stack, results)
    assert _wait_answering(stack).status_code == 200


def test_silent_lease_registry_gateway_fails_static_then_refuses_with_a_typed_503(stack: Stack) -> None:
    """A gateway whose only Redis store is the lease registry: last view for `fail_static`, then 503."""
    config = gateway_config(stack.model, registry={"kind": "redis", "url": stack.lab.url, "ttl": 2.0, "token": "t",
                                                   "fail_static": 3.0})
    gw = GatewayProcess(config, free_port(), stack.workdir, replica_id="gw-static")
    gw.start()
    try:
        gw.wait_live()
        _steady(stack)
        gw.wait_routable("tiny", 2)
        nodes = list(stack.lab.nodes)
        for node in nodes:
            node.pause()
        try:
            inside = oneshot_http.post(f"{gw.url}/v1/completions", json={**BODY, "max_tokens": 4}, timeout=30)
            assert inside.status_code == 200, inside.text  # routed on the last view
            refused = None
            deadline = time.monotonic() + 60
            while refused is None:
                assert time.monotonic() < deadline, "the fail-static window never closed"
                response = oneshot_http.post(f"{gw.url}/v1/completions", json={**BODY, "max_tokens": 4}, timeout=30)
                if response.status_code == 503 and response.json()["error"]["type"] == "lease_registry_unavailable":
                    refused = response
                time.sleep(0.2)
            assert refused.headers.get("Retry-After")
            ready = oneshot_http.get(f"{gw.url}/healthz/ready", timeout=10)
            assert ready.status_code == 503 and ready.json()["lease_view"]["mode"] == "refusing"
            assert gw.metric("lifeline_gateway_lease_registry_refused_total") >= 1
        finally:
            for node in nodes:
                node.resume()
        deadline = time.monotonic() + 60
        while oneshot_http.post(f"{gw.url}/v1/completions", json={**BODY, "max_tokens": 4}, timeout=30).status_code != 200:
            assert time.monotonic() < deadline, "the gateway never admitted again after the registry returned"
            time.sleep(0.2)
    finally:
        gw.kill()
