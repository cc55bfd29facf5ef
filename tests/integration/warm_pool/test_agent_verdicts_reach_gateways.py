"""Verdicts travel from the agent to the gateways through the one contract (`contract.verdict`), on real Redis.

The agent judges engines that renew their own leases (so no lease of the
agent's is there to release) and publishes its board beside the leases; a
gateway's router, reading the same Redis, ejects on wrong_output, de-weights
on overloaded and takes no new sessions to a draining engine. A restarted
engine (a new generation) starts clean, and when the agent stops publishing
the board lapses and the gateway routes by leases alone.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from common.clock import ManualClock, SystemClock
from contract.identity import DRAINING_ERROR_TYPE
from contract.lease import Registration, RedisLeaseRegistry
from contract.verdict import RedisVerdictBoard, VerdictBoard, verdicts_key
from gateway.admission import Admission
from gateway.router import LeaseView, Router
from gateway.routing_table import StaticRoutingTable
from gateway.settings import GatewaySettings
from gateway.verdicts import VerdictView
from tests.unit.warm_pool.test_pool_agent import RECORD, Fleet, ScriptedEngine, settle
from warm_pool.agent import Agent
from warm_pool.budget import ProbeBudget
from warm_pool.events import EventShipper
from warm_pool.settings import AgentSettings

REDIS_URL = "redis://127.0.0.1:6379/0"
REGION = "r1"


class Engine(ScriptedEngine):
    """A scripted engine whose readiness can say 429 (overloaded) or 503 draining."""

    ready_status: int = 200

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/healthz/ready" and self.ready_status == 429:
            return httpx.Response(429, json={"error": {"type": "overloaded", "message": "queue full"}})
        if request.url.path == "/healthz/ready" and self.ready_status == 503:
            return httpx.Response(503, json={"error": {"type": DRAINING_ERROR_TYPE, "message": "draining"}})
        return super().handle(request)


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    prefix = f"lifeline-test-{uuid.uuid4().hex[:8]}"
    yield prefix
    cleaner = RedisLeaseRegistry.from_url(REDIS_URL, region=REGION, prefix=prefix)
    keys = [k async for k in cleaner.redis.scan_iter(f"{prefix}:*")]
    if keys:
        await cleaner.redis.delete(*keys)
    await cleaner.close()


def gateway_router(registry: RedisLeaseRegistry, prefix: str) -> tuple[Router, VerdictView]:
    settings = GatewaySettings(region=REGION, models=[{"alias": "m", "version": "v1", "model_dir": Path("/nonexistent")}],
                               admission={"max_concurrency_per_engine": 16, "max_queue": 0},
                               registry={"kind": "redis", "url": REDIS_URL, "key_prefix": prefix})
    view = VerdictView(RedisVerdictBoard(registry.redis, region=REGION, prefix=prefix), refresh_interval=3600,
                       clock=SystemClock())
    leases = LeaseView(registry, refresh_interval=3600, cached=False)
    return Router(settings, StaticRoutingTable(settings.models), leases, Admission(settings.admission), ManualClock(),
                  verdicts=view), view


async def test_the_agents_verdicts_eject_deweight_and_drain_at_the_gateway(prefix: str) -> None:
    engines_registry = RedisLeaseRegistry.from_url(REDIS_URL, region=REGION, prefix=prefix, ttl=timedelta(seconds=30))
    agent_registry = RedisLeaseRegistry.from_url(REDIS_URL, region=REGION, prefix=prefix, ttl=timedelta(seconds=30))
    gateway_registry = RedisLeaseRegistry.from_url(REDIS_URL, region=REGION, prefix=prefix)
    fleet = Fleet()
    names = ("sound", "corrupt", "busy", "leaving")
    for name in names:  # engines with leases of their own (started with --registry)
        fleet.engines[name] = Engine(name, version="v1")
        await engines_registry.register(Registration(name, f"http://{name}", "v1", "z1", REGION))
    fleet.engines["corrupt"].output = [5, 9, 7]
    fleet.engines["busy"].ready_status = 429
    fleet.engines["leaving"].ready_status = 503

    clock = ManualClock()
    settings = AgentSettings(region=REGION, registry=REDIS_URL, registry_prefix=prefix)
    agent = Agent(settings, registry=agent_registry, http=httpx.AsyncClient(transport=fleet.transport()), clock=clock,
                  shipper=EventShipper(None, None), canary_records={"v1": RECORD}, agent_id="agent-r1",
                  budget=ProbeBudget(clock, per_instance_per_s=settings.canary_per_instance_per_s),
                  verdict_board=RedisVerdictBoard(agent_registry.redis, region=REGION, prefix=prefix))
    router, verdicts = gateway_router(gateway_registry, prefix)
    try:
        assert {e.instance_id for e in await router.endpoints("v1")} == set(names)  # no board yet: leases alone
        for _ in range(60):  # until the routine canary has found the corrupted engine
            await settle(agent, clock)
            if agent.instances["corrupt"].verdict is not None and agent.instances["corrupt"].verdict.value == "wrong_output":
                break
        await agent.publish_verdicts()
        assert {(i.instance_id, i.verdict.value if i.verdict else None) for i in agent.instances.values()} == {
            ("sound", "ok"), ("corrupt", "wrong_output"), ("busy", "overloaded"), ("leaving", "draining")}

        # the gateway side reads what the agent wrote, from Redis
        assert await verdicts.refresh()
        assert verdicts.last is not None and verdicts.last.agent_id == "agent-r1"
        assert {e.instance_id for e in await router.endpoints("v1")} == {"sound", "busy"}
        picks = Counter()
        for _ in range(10):  # without a client key: busy takes a quarter share (admission.overloaded_weight)
            picks[(await router.acquire("v1", client_key=None, queue_timeout=0)).instance_id] += 1
        # (outstanding + 1) ÷ weight: sound's 1..8 against busy's 4, 8; ties broken either way end here
        assert picks == {"sound": 8, "busy": 2}
        for endpoint in await router.endpoints("v1"):
            while router.admission.outstanding[endpoint.instance_id]:
                await router.release(endpoint)
        hashed = set()
        for n in range(40):  # an idle fleet: every hashed client goes to the healthy one, none to the busy one
            endpoint = await router.acquire("v1", client_key=f"client-{n}", queue_timeout=0)
            hashed.add(endpoint.instance_id)
            await router.release(endpoint)
        assert hashed == {"sound"}

        # a restart of the corrupted engine is a new generation: the old verdict does not follow it
        await engines_registry.register(Registration("corrupt", "http://corrupt", "v1", "z1", REGION))
        assert "corrupt" in {e.instance_id for e in await router.endpoints("v1")}

        # the agent gone: its board lapses (one lease TTL) and the gateway routes by leases alone
        short = RedisVerdictBoard(agent_registry.redis, region=REGION, prefix=prefix)
        await short.publish(agent.verdicts(), ttl=timedelta(milliseconds=200))
        for _ in range(100):
            if await agent_registry.redis.get(verdicts_key(REGION, prefix)) is None:
                break
            await asyncio.sleep(0.05)
        assert await verdicts.refresh() and verdicts.last is None
        assert {e.instance_id for e in await router.endpoints("v1")} == set(names)
    finally:
        await agent.close()
        for registry in (engines_registry, agent_registry, gateway_registry):
            await registry.close()


async def test_a_board_that_is_not_one_routes_by_leases_alone(prefix: str) -> None:
    registry = RedisLeaseRegistry.from_url(REDIS_URL, region=REGION, prefix=prefix, ttl=timedelta(seconds=30))
    try:
        await registry.register(Registration("e1", "http://e1", "v1", "z1", REGION))
        router, verdicts = gateway_router(registry, prefix)
        await registry.redis.set(verdicts_key(REGION, prefix), '{"region": "r1", "verdicts": "no"}')
        assert await verdicts.refresh() and verdicts.last is None
        assert [e.instance_id for e in await router.endpoints("v1")] == ["e1"]
        with pytest.raises(ValueError, match="region"):
            await RedisVerdictBoard(registry.redis, region="r2", prefix=prefix).publish(
                VerdictBoard(region="r1", agent_id="a", published_at=ManualClock().utcnow()), ttl=timedelta(seconds=1))
    finally:
        await registry.close()
