"""A probe round over many engines: at most `probe_concurrency` probes in flight, each timed from when it is sent."""

from __future__ import annotations

import asyncio

import httpx

from common.clock import ManualClock
from contract.lease import Registration
from warm_pool.agent import Agent
from warm_pool.settings import AgentSettings

from tests.unit.warm_pool.test_pool_agent import Fleet, MemoryRegistry, ScriptedEngine

ENGINES = 12
ANSWER_DELAY_S = 0.05  # each of a probe's three requests: a probe takes 0.15 s, a round of 12 at 3 at a time 0.6 s


async def test_a_round_longer_than_the_probe_timeout_judges_every_healthy_engine_ok() -> None:
    clock, fleet = ManualClock(), Fleet()
    in_flight, most = 0, 0

    async def slow(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        try:
            await asyncio.sleep(ANSWER_DELAY_S)
            return fleet.engines[request.url.host].handle(request)
        finally:
            in_flight -= 1

    registry = MemoryRegistry(clock)
    for n in range(ENGINES):
        fleet.engines[f"e{n}"] = ScriptedEngine(f"e{n}")
        await registry.register(Registration(f"e{n}", f"http://e{n}", "v1", "z1", "r1"))
    agent = Agent(AgentSettings(region="r1", probe_concurrency=3, probe_timeout=0.3), registry=registry,
                  http=httpx.AsyncClient(transport=httpx.MockTransport(slow)), clock=clock)
    await agent.tick()
    assert sorted(i.health.verdict.value for i in agent.instances.values()) == ["ok"] * ENGINES
    assert most == 3
