"""The agent writes leases through contract.lease on the real Redis; the control plane's reader sees them.

Engines are scripted (httpx.MockTransport) so the test is about the store:
the record the agent registers for a stock engine, its renewal, and its
release on a failed probe, read back through `RedisLeaseReader` — the side
the control plane and gateways use.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import httpx

from common.clock import SystemClock
from contract.lease import RedisLeaseReader, RedisLeaseRegistry
from warm_pool.agent import Agent
from warm_pool.settings import AgentSettings

REDIS_URL = "redis://127.0.0.1:6379/0"
IDENTITY = {"instance_id": "vllm-7", "generation": 1, "boot_generation": 1, "model": "v9", "weights_digest": "sha256:x",
            "zone": "z3", "region": "r-int", "started_at": 0.0}


async def test_agent_leases_for_a_stock_engine_through_the_real_registry() -> None:
    healthy = True

    def engine(request: httpx.Request) -> httpx.Response:
        if not healthy:
            return httpx.Response(500)
        if request.url.path == "/healthz/generation":
            return httpx.Response(200, json=IDENTITY)
        if request.url.path == "/v1/completions":  # the first-lease check: a stream with per-token ids
            return httpx.Response(200, headers={"content-type": "text/event-stream"},
                                  content=b'data: {"choices": [{"text": " a", "token_ids": [5]}]}\n\ndata: [DONE]\n\n')
        return httpx.Response(200, json={"status": "ok"})

    prefix = f"test-{uuid.uuid4().hex[:8]}"
    registry = RedisLeaseRegistry.from_url(REDIS_URL, region="r-int", prefix=prefix, ttl=timedelta(seconds=2))
    reader = RedisLeaseReader.from_url(REDIS_URL, prefix=prefix)
    http = httpx.AsyncClient(transport=httpx.MockTransport(engine))
    agent = Agent(AgentSettings(region="r-int", registry=REDIS_URL, registry_prefix=prefix,
                                renew_leases_for="http://vllm-7:8000"),
                  registry=registry, http=http, clock=SystemClock())
    try:
        await agent.tick()
        [lease] = reader.list_instances("r-int")
        assert (lease.instance_id, lease.url, lease.version, lease.zone, lease.region) == (
            "vllm-7", "http://vllm-7:8000", "v9", "z3", "r-int")
        first_expiry = lease.expires_at
        await asyncio.sleep(0.05)
        await agent.tick()
        [renewed] = reader.list_instances("r-int")
        assert renewed.generation == lease.generation and renewed.expires_at > first_expiry

        healthy = False
        await agent.tick()
        assert reader.list_instances("r-int") == []  # released at once, not left to lapse
    finally:
        await agent.close()
        await registry.close()
        await http.aclose()
        reader.redis.close()
