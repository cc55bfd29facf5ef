"""Hostile resume cursors against a gateway on the Redis token log: a 400 before the first byte, never a cut stream.

Before: `Last-Event-ID: -5` (or `10**20`) became the stream id `-3-0` (or one
past 64 bits), Redis refused it after the 200 was sent, and the client saw
the body break off (`incomplete chunked read`). The stream itself must not
notice: a resume with a good cursor still gets every frame after it.
"""

from __future__ import annotations

import uuid

import pytest
import redis

from common import oneshot_http
from lifeline.processes import gateway_config
from tests.e2e.gateway.conftest import resume, stream

REDIS_URL = "redis://127.0.0.1:6379/0"
BODY = {"model": "tiny", "prompt": "A client resumes with garbage", "max_tokens": 24, "temperature": 0.0,
        "ignore_eos": True, "return_token_ids": True}


@pytest.fixture
def key_prefix():
    prefix = f"lifeline-test-{uuid.uuid4().hex[:10]}"
    yield prefix
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)


def test_garbage_resume_cursors_are_a_400_and_leave_the_stream_resumable(cluster_factory, key_prefix) -> None:
    cluster = cluster_factory()
    cluster.start_gateway(gateway_config(cluster.model, token_log={
        "kind": "redis", "url": REDIS_URL, "key_prefix": f"{key_prefix}:stream", "owner_ttl": 1.0}))
    cluster.start_engine("engine-a", ["--fault-token-delay-ms", "20"])
    cluster.gateway.wait_routable("tiny", 1)
    url = cluster.gateway.url
    whole = stream(url, BODY)
    assert whole.done and len(whole.token_ids) == BODY["max_tokens"]

    first = stream(url, BODY, stop_after=3)  # then hang up: the stream is detached, resumable
    for cursor in ("-5", "99999999999999999999", "18446744073709551615", "1_0"):
        response = oneshot_http.get(f"{url}/v1/streams/{first.request_id}", headers={"Last-Event-ID": cursor}, timeout=60)
        assert response.status_code == 400, (cursor, response.text)
        assert response.json()["error"]["param"] == "Last-Event-ID"
    rest = resume(url, first.request_id, first.seqs[-1])
    assert rest.done and rest.error is None
    assert rest.seqs[0] == first.seqs[-1] + 1
    assert first.token_ids + rest.token_ids == whole.token_ids
