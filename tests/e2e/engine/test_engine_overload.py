"""A full queue is refused, not grown: the engine's `--max-waiting`, and what a client of the gateway gets.

One real engine decodes one sequence at a time (`--max-num-seqs 1`), holds
one more waiting (`--max-waiting 1`) and holds each first token 8 s so both
stay; the third
request is refused at once with 429 `engine_overloaded` and `Retry-After`,
nothing of it queued, and the two it took finish whole. Behind a real gateway
the same full engine costs a client nothing while another engine has room
(the request is served there, token-identical), and, when it is the only
engine, the client gets the gateway's 429 `overloaded` with `Retry-After`.
"""

from __future__ import annotations

import threading

import pytest

from common import oneshot_http
from lifeline.processes import GatewayProcess, free_port, gateway_config, scrape_metric
from tests.support.sse import StreamResult, stream_completion
from tests.support.waiting import wait_for

pytestmark = pytest.mark.long  # scheduled first in its tier (tests/conftest.py)

# One decode slot, one queue place, and every sequence held 8 s before its first token (in the scheduler, not on
# the wire): an engine that stays full for that long however fast this machine decodes.
FULL = ["--max-num-seqs", "1", "--max-waiting", "1", "--fault-first-token-delay-ms", "8000"]
BODY = {"model": "tiny-seed0", "prompt": [11, 12, 13], "max_tokens": 12, "temperature": 0.0, "ignore_eos": True,
        "return_token_ids": True}


def metric(url: str, name: str) -> float:
    return scrape_metric(f"{url}/metrics", name)


class Fill:
    """Two streams straight to the idle engine at `url`: with one decode slot and one queue place, one runs, one
    waits, for the 8 s their first tokens are held."""

    def __init__(self, url: str) -> None:
        wait_for(lambda: metric(url, "vllm:num_requests_running") == 0 and metric(url, "vllm:num_requests_waiting") == 0,
                 "the engine idle")
        self.results: list[StreamResult] = []
        self.threads = [threading.Thread(target=lambda: self.results.append(stream_completion(url, BODY)),
                                         daemon=True) for _ in range(2)]
        # One after the other: two submitted before the decode loop admits the first would both be waiting,
        # and the second refused.
        self.threads[0].start()
        wait_for(lambda: metric(url, "vllm:num_requests_running") == 1, "the first running")
        self.threads[1].start()
        wait_for(lambda: metric(url, "vllm:num_requests_waiting") == 1, "the second waiting")

    def finished_whole(self) -> bool:
        for thread in self.threads:
            thread.join(60)
        return [len(r.token_ids) for r in self.results] == [12, 12] and all(r.done and not r.error
                                                                           for r in self.results)


def test_a_full_queue_refuses_at_once_with_retry_after_and_the_requests_it_took_finish_whole(engine_factory) -> None:
    url = engine_factory("full", extra_args=FULL).url
    streams = Fill(url)
    refused = oneshot_http.post(f"{url}/v1/completions", json=BODY, timeout=10)
    assert refused.status_code == 429, refused.text
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["type"] == "engine_overloaded"
    assert metric(url, "vllm:num_requests_waiting") == 1  # nothing of it was queued
    assert metric(url, "lifeline_engine_refused_overloaded_total") == 1
    assert streams.finished_whole()


def test_behind_the_gateway_a_full_engine_sends_the_client_elsewhere_or_a_429(engine_factory, tmp_path) -> None:
    gateway = GatewayProcess(gateway_config(engine_factory.model, recovery={"stall_timeout": 5.0},
                                            admission={"queue_timeout": 0.5}), free_port(),
                             tmp_path)
    gateway.start()
    try:
        gateway.wait_live()
        full = engine_factory("full", extra_args=[*FULL, *gateway.registry_args()])
        free = engine_factory("free", extra_args=gateway.registry_args())
        gateway.wait_routable("tiny", 2)
        expected = stream_completion(free.url, BODY).token_ids
        pinned = {"X-Lifeline-Prefer-Instance": "full"}

        streams = Fill(full.url)
        moved = stream_completion(gateway.url, {**BODY, "model": "tiny"}, headers=pinned)
        assert moved.done and not moved.error and moved.token_ids == expected
        assert metric(full.url, "lifeline_engine_refused_overloaded_total") == 1  # it was asked first, and said no
        assert streams.finished_whole()

        free.kill()  # now the full engine is the only one
        wait_for(lambda: oneshot_http.get(f"{gateway.url}/healthz/ready", timeout=5).json()["routable_endpoints"]["tiny"]
                 == 1, "only the full engine routable")
        streams = Fill(full.url)
        refused = oneshot_http.post(f"{gateway.url}/v1/completions", json={**BODY, "model": "tiny", "stream": True},
                                    headers=pinned, timeout=30)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["type"] == "overloaded" and float(refused.headers["retry-after"]) >= 1
        assert streams.finished_whole()
    finally:
        gateway.kill()
