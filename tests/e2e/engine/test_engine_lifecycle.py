"""Real engine processes killed, restarted, hung and corrupted."""

from __future__ import annotations

import hashlib
import json
import signal
import threading
import time

import httpx
import pytest
from httpx_sse import connect_sse

from common import oneshot_http
from contract.identity import EngineIdentity, weights_digest
from tests.support.sse import complete, stream_completion

BODY = {"model": "tiny-seed0", "prompt": "Cut over the primary region", "max_tokens": 24,
        "temperature": 0.0, "ignore_eos": True, "return_token_ids": True}


def _status(url: str, path: str) -> int | None:
    try:
        return oneshot_http.get(f"{url}{path}", timeout=2).status_code
    except httpx.TransportError:
        return None


def _catalog_digest(model_dir) -> str:
    """What the catalog computes from the shard digests it records at registration."""
    shards = sorted(model_dir.glob("*.safetensors"))
    assert len(shards) > 1
    return weights_digest({p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in shards})


def test_sigkill_and_restart_bumps_boot_generation(engine_factory) -> None:
    engine = engine_factory("gen-engine")
    first = oneshot_http.get(f"{engine.url}/healthz/generation").json()
    assert first["instance_id"] == "gen-engine" and first["generation"] == 1
    assert EngineIdentity.model_validate(first).weights_digest == _catalog_digest(engine.model)
    response = complete(engine.url, BODY)
    # No --registry: whoever leases it (the agent) owns the generation, so frames carry none of ours.
    assert response.headers["X-Lifeline-Instance"] == "gen-engine"
    assert "X-Lifeline-Generation" not in response.headers
    engine.kill(signal.SIGKILL)
    assert _status(engine.url, "/healthz/live") is None
    engine.start()
    engine.wait_ready()
    second = oneshot_http.get(f"{engine.url}/healthz/generation").json()
    assert second["generation"] == 2
    assert second["weights_digest"] == first["weights_digest"]
    assert complete(engine.url, BODY).json()["choices"][0]["token_ids"] == response.json()["choices"][0]["token_ids"]


def test_ready_only_after_self_test_generation(engine_factory) -> None:
    # A slow first token stretches the self-test, so the not-ready window is observable.
    engine = engine_factory("slow-boot", extra_args=["--fault-first-token-delay-ms", "1500"], wait_ready=False)
    seen: set[tuple[int | None, int | None]] = set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = (_status(engine.url, "/healthz/live"), _status(engine.url, "/healthz/ready"))
        seen.add(state)
        if state == (200, 200):
            break
        time.sleep(0.05)
    assert (200, 200) in seen
    assert (200, 503) in seen or (None, None) in seen
    assert _status(engine.url, "/health") == 200


def test_exit_after_tokens_delivers_exactly_n_tokens_then_dies(engine_factory) -> None:
    reference = stream_completion(engine_factory("healthy").url, BODY).token_ids
    engine = engine_factory("exit-engine", extra_args=["--fault-exit-after-tokens", "5"])
    received: list[int] = []
    with pytest.raises(httpx.HTTPError):
        with httpx.Client(timeout=20) as client, connect_sse(
            client, "POST", f"{engine.url}/v1/completions", json={**BODY, "stream": True}
        ) as source:
            for event in source.iter_sse():
                received += json.loads(event.data)["choices"][0]["token_ids"]
    assert received == reference[:5]
    assert engine.process.wait(timeout=10) == 137
    assert '"fault": "exit"' in engine.logs()


def test_hang_keeps_the_socket_open_and_health_green(engine_factory) -> None:
    engine = engine_factory("hang-engine", extra_args=["--fault-hang-after-tokens", "3"])
    with pytest.raises(httpx.ReadTimeout):
        stream_completion(engine.url, BODY, timeout=2.0)
    assert engine.process.poll() is None
    assert _status(engine.url, "/healthz/ready") == 200
    assert _status(engine.url, "/healthz/live") == 200  # one stream stopped sending; the decode loop still steps
    metrics = oneshot_http.get(f"{engine.url}/metrics").text
    assert 'lifeline_engine_faults_injected_total{fault="hang"}' in metrics


def test_fail_next_requests_then_recover(engine_factory) -> None:
    engine = engine_factory("flaky-engine", extra_args=["--fault-fail-next-requests", "2"])
    codes = [complete(engine.url, BODY).status_code for _ in range(3)]
    assert codes == [500, 500, 200]


def test_corrupted_weights_change_output_while_health_stays_green(engine_factory) -> None:
    engine = engine_factory("corrupt-engine", extra_args=["--enable-fault-admin"])
    healthy = complete(engine.url, BODY).json()["choices"][0]["token_ids"]
    oneshot_http.post(f"{engine.url}/admin/faults", json={"corrupt_weights": True}).raise_for_status()
    corrupted = complete(engine.url, BODY).json()["choices"][0]["token_ids"]
    assert corrupted != healthy
    assert _status(engine.url, "/healthz/ready") == 200
    assert 'lifeline_engine_faults_injected_total{fault="corrupt_weights"} 1.0' in oneshot_http.get(f"{engine.url}/metrics").text


def test_token_delay_slows_one_stream_not_the_server(engine_factory) -> None:
    engine = engine_factory("delay-engine", extra_args=["--enable-fault-admin"])
    oneshot_http.post(f"{engine.url}/admin/faults", json={"token_delay_ms": 200}).raise_for_status()
    chunks: list[dict] = []
    worker = threading.Thread(target=lambda: chunks.extend(stream_completion(engine.url, {**BODY, "max_tokens": 10}).chunks))
    worker.start()
    time.sleep(0.3)
    assert _status(engine.url, "/healthz/ready") == 200  # answered mid-stream
    worker.join(timeout=30)
    assert len(chunks) == 10
    faults = oneshot_http.get(f"{engine.url}/admin/faults").json()
    assert faults["token_delay_ms"] == 200


def test_fault_admin_is_off_unless_enabled_and_rejects_bad_input(engine_factory) -> None:
    plain = engine_factory("no-admin")
    assert oneshot_http.post(f"{plain.url}/admin/faults", json={"exit_after_tokens": 0}).status_code == 404
    admin = engine_factory("admin", extra_args=["--enable-fault-admin"])
    bad = oneshot_http.post(f"{admin.url}/admin/faults", json={"token_delay_ms": -5})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "token_delay_ms"
    assert oneshot_http.get(f"{admin.url}/admin/faults").json()["token_delay_ms"] == 0
