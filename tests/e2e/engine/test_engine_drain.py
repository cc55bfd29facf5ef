"""SIGTERM drains an engine in order: not ready and lease released, in-flight finish, stragglers get engine_draining."""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid

import httpx
from httpx_sse import connect_sse

from common import oneshot_http
from contract.identity import DRAINING_ERROR_TYPE
from contract.lease import RedisLeaseReader
from tests.support.sse import complete

BODY = {"model": "tiny-seed0", "prompt": "Drain the zone before the upgrade", "temperature": 0.0,
        "ignore_eos": True, "return_token_ids": True}


def _wait_for(predicate, what: str, timeout: float = 30.0):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class StreamReader(threading.Thread):
    """Reads one streamed completion to its end: tokens, the error event if any, and [DONE]."""

    def __init__(self, url: str, body: dict) -> None:
        super().__init__(daemon=True)
        self.url, self.body = url, body
        self.token_ids: list[int] = []
        self.error: dict | None = None
        self.done = False
        self.first_token = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=60) as client, connect_sse(
            client, "POST", f"{self.url}/v1/completions", json={**self.body, "stream": True}
        ) as source:
            for event in source.iter_sse():
                if event.data == "[DONE]":
                    self.done = True
                    break
                chunk = json.loads(event.data)
                if "error" in chunk:
                    self.error = chunk["error"]
                    break
                self.token_ids += chunk["choices"][0]["token_ids"]
                self.first_token.set()


def test_sigterm_steps_down_first_lets_short_requests_finish_and_ends_the_rest(engine_factory) -> None:
    prefix = f"test-drain-{uuid.uuid4().hex[:8]}"
    reader = RedisLeaseReader.from_url("redis://127.0.0.1:6379/0", prefix=prefix)
    engine = engine_factory("drain-engine", extra_args=[
        "--registry", f"redis://127.0.0.1:6379/0?key_prefix={prefix}&ttl_ms=2000", "--enable-fault-admin",
        "--drain-unroute-wait", "0.5", "--drain-timeout", "3"])
    _wait_for(lambda: reader.list_instances("local"), "the lease")
    long_reference = complete(engine.url, {**BODY, "max_tokens": 60}).json()["choices"][0]["token_ids"]
    oneshot_http.post(f"{engine.url}/admin/faults", json={"token_delay_ms": 100}).raise_for_status()

    long = StreamReader(engine.url, {**BODY, "max_tokens": 60})  # ~6 s: outlives the drain timeout
    short = StreamReader(engine.url, {**BODY, "max_tokens": 8})  # ~1 s: finishes inside it
    for stream in (long, short):
        stream.start()
        assert stream.first_token.wait(30)
    engine.process.send_signal(signal.SIGTERM)

    ready = _wait_for(lambda: (r := oneshot_http.get(f"{engine.url}/healthz/ready", timeout=5)).status_code == 503 and r,
                      "not ready")
    assert ready.json()["engine_status"] == "draining"
    _wait_for(lambda: not reader.list_instances("local"), "the lease to be released")
    refused = complete(engine.url, {**BODY, "max_tokens": 4})
    assert refused.status_code == 503 and refused.json()["error"]["type"] == DRAINING_ERROR_TYPE
    assert long.is_alive() and long.error is None  # stepped down while requests were still in flight

    short.join(30)
    long.join(30)
    assert short.done and short.error is None and short.token_ids == long_reference[:8]
    assert not long.done and long.error is not None
    assert long.error["type"] == DRAINING_ERROR_TYPE and long.error["code"] == 503
    assert 8 <= len(long.token_ids) < 60 and long.token_ids == long_reference[: len(long.token_ids)]
    assert engine.wait_exit(timeout=20) == 0
    logs = engine.logs()
    assert logs.index('"drain started') < logs.index('"drain deadline passed') < logs.index('"engine stopped')
