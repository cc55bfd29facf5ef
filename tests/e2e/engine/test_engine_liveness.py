"""Liveness means "can generate": a real engine whose decode loop is wedged inside a step answers 503 live."""

from __future__ import annotations

import threading
import time

import httpx

from common import oneshot_http
from tests.support.sse import StreamResult, complete, stream_completion

BOUND_S = 1.0
BODY = {"model": "tiny-seed0", "prompt": "Cut over the primary region", "max_tokens": 24,
        "temperature": 0.0, "ignore_eos": True, "return_token_ids": True}


def _live(url: str) -> httpx.Response:
    return oneshot_http.get(f"{url}/healthz/live", timeout=5)


def _wait_for_live_status(url: str, status: int, seen: list[int]) -> httpx.Response:
    # The deadline bounds a broken test; nothing here asserts how fast the engine is.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        response = _live(url)
        seen.append(response.status_code)
        if response.status_code == status:
            return response
        time.sleep(0.05)
    raise AssertionError(f"/healthz/live never answered {status}; saw {sorted(set(seen))}")


def test_stalled_decode_step_turns_liveness_off_then_on_when_it_resumes(engine_factory) -> None:
    engine = engine_factory("stall-engine", extra_args=[
        "--enable-fault-admin", "--step-stall-bound", str(BOUND_S), "--fault-stall-step-after-tokens", "3"])
    expected = complete(engine_factory("healthy").url, BODY).json()["choices"][0]["token_ids"]
    time.sleep(BOUND_S * 1.5)  # idle past the bound: no work is not a stall
    idle = _live(engine.url)
    assert idle.status_code == 200 and idle.json()["step_age_s"] is None

    results: list[StreamResult] = []
    streamer = threading.Thread(target=lambda: results.append(stream_completion(engine.url, BODY)))
    streamer.start()
    seen: list[int] = []
    stalled = _wait_for_live_status(engine.url, 503, seen)
    assert stalled.json()["error"]["type"] == "decode_loop_stalled"
    assert f"{BOUND_S:g} s bound" in stalled.json()["error"]["message"]
    assert oneshot_http.get(f"{engine.url}/healthz/ready").status_code == 200  # the process answers; it cannot generate
    assert streamer.is_alive() and not results  # the stream is stuck with the loop
    assert 'lifeline_engine_faults_injected_total{fault="stall_step"} 1.0' in oneshot_http.get(f"{engine.url}/metrics").text

    oneshot_http.post(f"{engine.url}/admin/faults", json={}).raise_for_status()  # the step finishes
    resumed = _wait_for_live_status(engine.url, 200, seen)
    assert resumed.json()["status"] == "live"
    streamer.join(timeout=60)
    [result] = results
    assert result.token_ids == expected and result.finish_reason == "length"
    assert _live(engine.url).status_code == 200
