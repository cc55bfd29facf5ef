"""A rolling restart of every engine behind a gateway, under steady streaming load, loses nothing.

Promise tested: service, request and semantic recovery across a planned
shutdown. Each engine in turn gets SIGTERM while streams run on it: it steps
down (not ready, lease released), lets short work finish, ends the rest with
`engine_draining`, exits 0 and is started again under a new generation. Every
stream a client started during the roll must complete, token-identical to an
undisturbed greedy run.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest

from lifeline.processes import EngineProcess, GatewayProcess, built_model, free_port, gateway_config, scrape_metric
from tests.e2e.gateway.conftest import StreamResult, direct_tokens, stream

pytestmark = pytest.mark.long  # scheduled first in its tier (tests/conftest.py)

PROMPTS = ["Roll the first zone", "Every stream survives the upgrade", "Drain, restart, rejoin the pool"]
MAX_TOKENS = 32
CLIENTS = 4
ENGINE_ARGS = ["--fault-token-delay-ms", "40",  # a stream lasts ~1.3 s, longer than the drain timeout
               "--drain-unroute-wait", "0.5", "--drain-timeout", "0.5"]


def _body(prompt: str) -> dict:
    return {"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True,
            "return_token_ids": True}


def _wait_for(predicate, what: str, timeout: float = 60.0):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class Load:
    """`CLIENTS` threads streaming through the gateway back to back until stopped."""

    def __init__(self, gateway_url: str) -> None:
        self.gateway_url = gateway_url
        self.results: list[tuple[str, StreamResult | Exception]] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(CLIENTS)]

    def _client(self, index: int) -> None:
        n = index
        while not self.stop.is_set():
            prompt = PROMPTS[n % len(PROMPTS)]
            n += 1
            try:
                result: StreamResult | Exception = stream(self.gateway_url, _body(prompt), timeout=60)
            except Exception as exc:  # noqa: BLE001 - every failure is reported below
                result = exc
            self.results.append((prompt, result))

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=120)


def test_rolling_restart_under_streaming_load_is_lossless_and_token_identical(tmp_path: Path) -> None:
    model = built_model("tiny", 0)
    gateway = GatewayProcess(gateway_config(model), free_port(), tmp_path / "gateway")
    engines: list[EngineProcess] = []
    try:
        gateway.start()
        gateway.wait_live()
        for name in ("roll-a", "roll-b"):
            engine = EngineProcess(model, free_port(), name, tmp_path / "state" / name, tmp_path / f"{name}.log",
                                   extra_args=[*gateway.registry_args(), *ENGINE_ARGS])
            engines.append(engine)
            engine.start()
        for engine in engines:
            engine.wait_ready()
        gateway.wait_routable("tiny", 2)
        expected = {p: direct_tokens(engines[0].url, model, _body(p)) for p in PROMPTS}

        with Load(gateway.url) as load:
            _wait_for(lambda: len(load.results) >= CLIENTS, "the load to get going")
            for engine in engines:
                previous = gateway.leases()[engine.instance_id]
                _wait_for(lambda e=engine: scrape_metric(f"{e.url}/metrics", "vllm:num_requests_running") >= 1,
                          f"streams on {engine.instance_id}")
                engine.process.send_signal(signal.SIGTERM)
                assert engine.wait_exit(timeout=60) == 0, engine.logs()[-3000:]
                engine.start()
                engine.wait_ready()
                gateway.wait_generation_above(engine.instance_id, previous)
                gateway.wait_routable("tiny", 2)
            settled = len(load.results)
            _wait_for(lambda: len(load.results) >= settled + CLIENTS, "streams on the restarted engines")

        failures = [(p, r) for p, r in load.results if isinstance(r, Exception) or r.error is not None or not r.done]
        assert failures == []
        mismatched = [p for p, r in load.results if r.token_ids != expected[p]]
        assert mismatched == []
        assert all(r.seqs == list(range(len(r.seqs))) for _, r in load.results)
        cut_short = sum(engine.logs().count('"drain deadline passed') for engine in engines)
        assert cut_short >= 1, "no stream was in flight past the drain deadline: the engine_draining path went untested"
        assert any(r.epochs[-1] > 0 for _, r in load.results)  # those streams migrated and still matched
    finally:
        for engine in engines:
            engine.kill()
        gateway.kill()
