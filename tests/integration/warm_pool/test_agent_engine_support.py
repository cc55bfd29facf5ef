"""An engine whose streams carry no per-token ids is refused at its first lease, over real HTTP and the real registry.

The engine here is a stand-in on purpose: it plays an OLD vLLM (before
0.10.2), which answers `/health`, `/v1/models` and streamed `/v1/completions`
but ignores `return_token_ids` and sends text alone. The current vLLM passes
the same check in tests/e2e/vllm/test_agent_vllm.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from common.clock import SystemClock
from contract.lease import RedisLeaseReader, RedisLeaseRegistry
from warm_pool.agent import Agent
from warm_pool.settings import AgentSettings

REDIS_URL = "redis://127.0.0.1:6379/0"


class OldVllm(BaseHTTPRequestHandler):
    """vLLM before 0.10.2, as far as the agent asks: no token ids in streamed chunks."""

    def log_message(self, *args) -> None:  # quiet
        pass

    def _json(self, status: int, body: dict) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/health":
            self._json(200, {})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "old-v1", "object": "model"}]})
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.path != "/v1/completions":
            self._json(404, {"detail": "Not Found"})
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        for text in (" a", " b"):
            chunk = {"id": "cmpl-1", "object": "text_completion", "model": "old-v1",
                     "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture
def old_vllm() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), OldVllm)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


async def test_an_engine_without_per_token_ids_is_refused_with_the_minimum_version(old_vllm: str) -> None:
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    settings = AgentSettings(region="r-old", registry=REDIS_URL, registry_prefix=prefix, renew_leases_for=old_vllm,
                             probe_interval=timedelta(seconds=0.2))
    registry = RedisLeaseRegistry.from_url(REDIS_URL, region="r-old", prefix=prefix, ttl=settings.lease_ttl)
    reader = RedisLeaseReader.from_url(REDIS_URL, prefix=prefix)
    async with httpx.AsyncClient(timeout=5) as http:
        agent = Agent(settings, registry=registry, http=http, clock=SystemClock())
        try:
            for _ in range(5):
                await agent.tick()
                await asyncio.sleep(0.05)
            assert reader.list_instances("r-old") == []  # never leased
            [status] = agent.status()["instances"].values()
            assert status["verdict"] == "ok"  # it answers: alive, and still refused
            assert status["unleasable"].startswith("unsupported_engine:")
            assert "token_ids" in status["unleasable"] and "vLLM >= 0.10.2" in status["unleasable"]
            assert agent.metrics.registry.get_sample_value("lifeline_agent_unsupported_engines_total") == 1.0
        finally:
            await agent.close()
            await registry.close()
            reader.redis.close()
