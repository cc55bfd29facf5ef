"""Overload is refused without retry amplification; a gateway replica dies and another resumes via Redis."""

from __future__ import annotations

import signal
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis

from tests.e2e.gateway.conftest import direct_tokens, resume, stream
from lifeline.processes import gateway_config

REDIS_URL = "redis://127.0.0.1:6379/0"
BODY = {"model": "tiny", "prompt": "A burst arrives", "max_tokens": 8, "temperature": 0.0, "ignore_eos": True, "return_token_ids": True}


def test_burst_of_ten_times_capacity_gets_429_without_retry_amplification(cluster_factory):
    c = cluster_factory()
    gw = c.start_gateway(gateway_config(c.model, admission={"max_concurrency_per_engine": 2, "max_queue": 2, "queue_timeout": 0.2}))
    c.start_engine("busy", ["--fault-token-delay-ms", "30"])
    gw.wait_routable("tiny", 1)
    capacity = 2 + 2
    attempts_before = gw.metric("lifeline_gateway_engine_attempts_total")
    engine_before = _engine_requests(c.engines[0].url)

    def one(_: int) -> httpx.Response:
        return httpx.post(f"{gw.url}/v1/completions", json=BODY, timeout=60)

    with ThreadPoolExecutor(max_workers=10 * capacity) as pool:
        responses = list(pool.map(one, range(10 * capacity)))
    ok = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 429]
    assert len(ok) + len(refused) == len(responses)
    assert len(refused) >= len(responses) // 2 and len(ok) >= 2
    for r in refused:
        assert r.json()["error"]["type"] == "overloaded" and int(r.headers["retry-after"]) >= 1
    # No amplification: exactly one engine request per admitted client request.
    assert gw.metric("lifeline_gateway_engine_attempts_total") - attempts_before == len(ok)
    assert _engine_requests(c.engines[0].url) - engine_before == len(ok)
    assert gw.metric("lifeline_gateway_migrations_total") == 0
    assert gw.metric("lifeline_gateway_admission_rejected_total", {"type": "overloaded"}) == len(refused)


def _engine_requests(url: str) -> float:
    from lifeline.processes import scrape_metric

    return scrape_metric(f"{url}/metrics", "lifeline_engine_requests_total")


@pytest.fixture
def redis_prefix():
    prefix = f"lifeline-test:{uuid.uuid4().hex[:10]}"
    yield prefix
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(f"{prefix}*"))
    if keys:
        client.delete(*keys)
    client.close()


def test_gateway_replica_killed_mid_stream_client_resumes_on_another(cluster_factory, redis_prefix):
    c = cluster_factory()
    shared = {
        "registry": {"kind": "redis", "url": REDIS_URL, "key_prefix": f"{redis_prefix}:lease", "ttl": 2.0, "token": "t"},
        "token_log": {"kind": "redis", "url": REDIS_URL, "key_prefix": f"{redis_prefix}:stream", "owner_ttl": 1.0},
    }
    g1 = c.start_gateway(gateway_config(c.model, **shared), replica_id="gw-1")
    g2 = c.start_gateway(gateway_config(c.model, **shared), replica_id="gw-2")
    registry = ["--registry", f"{REDIS_URL}?key_prefix={redis_prefix}:lease"]
    eng = c.start_engine("shared-eng", ["--fault-token-delay-ms", "40"], registry=registry)
    g1.wait_routable("tiny", 1)
    g2.wait_routable("tiny", 1)
    body = {**BODY, "max_tokens": 40}
    expected = direct_tokens(eng.url, c.model, body)

    first = stream(g1.url, body, stop_after=7)
    g1.kill(signal.SIGKILL)
    rest = resume(g2.url, first.request_id, last_event_id=first.seqs[-1])
    assert first.seqs + rest.seqs == list(range(len(first.seqs) + len(rest.seqs)))
    assert first.token_ids + rest.token_ids == expected
    assert rest.done and rest.finish_reason == "length"
    assert max(rest.epochs) >= 1  # the second replica took over under a new epoch
    assert g2.metric("lifeline_gateway_resumes_total", {"mode": "takeover"}) == 1
    # The stream is in Redis: a third look from any replica replays it whole.
    again = resume(g2.url, first.request_id, last_event_id=None)
    assert again.token_ids == expected


def test_resume_of_unknown_stream_is_404(cluster_factory):
    c = cluster_factory()
    gw = c.start_gateway(gateway_config(c.model))
    response = httpx.get(f"{gw.url}/v1/streams/cmpl-nope", headers={"Last-Event-ID": "3"})
    assert response.status_code == 404 and response.json()["error"]["type"] == "not_found_error"
    bad = httpx.get(f"{gw.url}/v1/streams/cmpl-nope", headers={"Last-Event-ID": "x"})
    # the cursor is checked before the stream is looked up: a garbage one is the client's error, named
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "Last-Event-ID"
