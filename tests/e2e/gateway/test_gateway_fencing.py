"""Late frames from a replica that lost its stream are fenced off, not delivered.

A gateway replica that is paused (SIGSTOP: a long GC pause, a frozen VM, a
partition) while it drives a stream loses ownership; another replica takes
the stream over under a higher request epoch. When the paused replica wakes
up, its engine connection still holds tokens for the old epoch: every one of
them must be rejected by the token log's compare-and-set, never reach a
client, and never enter the log.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid

import httpx
import pytest
import redis
from httpx_sse import connect_sse

from tests.e2e.gateway.conftest import direct_tokens, parse_events, resume
from lifeline.processes import gateway_config

REDIS_URL = "redis://127.0.0.1:6379/0"
BODY = {"model": "tiny", "prompt": "The paused replica wakes up", "max_tokens": 40, "temperature": 0.0,
        "ignore_eos": True, "return_token_ids": True}


@pytest.fixture
def key_prefix():
    prefix = f"lifeline-test-{uuid.uuid4().hex[:10]}"
    yield prefix
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)


def test_paused_replica_late_frames_are_fenced_after_takeover(cluster_factory, key_prefix) -> None:
    c = cluster_factory()
    shared = {
        "registry": {"kind": "redis", "url": REDIS_URL, "key_prefix": f"{key_prefix}:lease", "ttl": 2.0, "token": "t"},
        "token_log": {"kind": "redis", "url": REDIS_URL, "key_prefix": f"{key_prefix}:stream", "owner_ttl": 1.0},
        "recovery": {"stall_timeout": 10.0},
    }
    g1 = c.start_gateway(gateway_config(c.model, **shared), replica_id="gw-paused")
    g2 = c.start_gateway(gateway_config(c.model, **shared), replica_id="gw-live")
    engine = c.start_engine("eng", ["--fault-token-delay-ms", "60"],
                            registry=["--registry", f"{REDIS_URL}?key_prefix={key_prefix}:lease"])
    g1.wait_routable("tiny", 1)
    g2.wait_routable("tiny", 1)
    expected = direct_tokens(engine.url, c.model, BODY)

    # A client stays connected to g1 throughout, as a slow client on a partitioned replica would.
    events: list[tuple[str, str, str]] = []
    six_seen = threading.Event()

    def read_from_g1() -> None:
        with httpx.Client(timeout=60) as client, connect_sse(
            client, "POST", f"{g1.url}/v1/completions", json={**BODY, "stream": True}
        ) as source:
            for sse in source.iter_sse():
                events.append((sse.id, sse.event, sse.data))
                if len(events) == 6:
                    six_seen.set()

    reader = threading.Thread(target=read_from_g1)
    reader.start()
    assert six_seen.wait(timeout=60), "g1 never streamed six events"
    g1.process.send_signal(signal.SIGSTOP)
    try:
        request_id = json.loads(events[0][2])["lifeline"]["request_id"]
        time.sleep(1.5)  # g1's ownership (owner_ttl 1 s) lapses while its engine keeps sending
        rest = resume(g2.url, request_id, last_event_id=5)
    finally:
        g1.process.send_signal(signal.SIGCONT)
    reader.join(timeout=60)
    assert not reader.is_alive()

    assert rest.seqs == list(range(6, 6 + len(rest.seqs)))
    assert rest.done and min(rest.epochs) >= 1
    replay = resume(g2.url, request_id, last_event_id=None)
    assert replay.token_ids == expected  # the log holds each token once, in order
    assert replay.seqs == list(range(len(replay.seqs)))
    # g1 woke up with old-epoch tokens in its socket: they were dropped, never sent.
    deadline = time.monotonic() + 20
    while g1.metric("lifeline_gateway_stale_frames_dropped_total") < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert g1.metric("lifeline_gateway_stale_frames_dropped_total") >= 1
    from_g1 = parse_events(events)
    assert from_g1.seqs == list(range(len(from_g1.seqs)))
    assert from_g1.token_ids == expected[: len(from_g1.token_ids)]
    assert len(from_g1.token_ids) < len(expected) and not from_g1.done
