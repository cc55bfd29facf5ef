"""A stream on the old version outlives the version roll's grace and completes token-identically; then it retires.

Real engine processes (the `local` driver, the tiny model; two served names
of the same weights stand for two versions), the real Redis lease registry,
the agent in the test's loop. The old version's engine decodes slowly
(`/admin/faults` token delay) so its stream is still running when v2 serves
the plan and the grace has passed: the agent reads the engine's in-flight
count (`vllm:num_requests_running`) and keeps it until the stream has ended,
then retires it (`pool.stopped`, not cut). The stream's tokens are compared
with the same greedy request answered before the roll.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from pathlib import Path

import httpx
from httpx_sse import aconnect_sse

from tests.support.pool_agent import AliasSnapshots, ticking_agent
from tests.support.waiting import until
from warm_pool.settings import AgentSettings
from warm_pool.states import InstanceState

REDIS_URL = "redis://127.0.0.1:6379/0"
REGION = "r-drain"
PROMPT = [11, 42, 7, 99, 5]
MAX_TOKENS = 400  # at 250 ms a token, far longer than v2's start and the grace; the delay is lifted once seen


async def stream_tokens(http: httpx.AsyncClient, url: str, first_token: asyncio.Event | None = None) -> list[int]:
    body = {"model": "v1", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True,
            "return_token_ids": True, "stream": True}
    tokens: list[int] = []
    async with aconnect_sse(http, "POST", f"{url}/v1/completions", json=body, timeout=300) as source:
        assert source.response.status_code == 200
        async for event in source.aiter_sse():
            if event.data == "[DONE]":
                break
            chunk = json.loads(event.data)
            assert "error" not in chunk, chunk
            for choice in chunk["choices"]:
                tokens.extend(choice.get("token_ids") or [])
            if tokens and first_token is not None:
                first_token.set()
    return tokens


async def test_a_stream_on_the_old_version_survives_the_roll_past_the_grace_and_completes_token_identically(
        tiny_model: Path, tmp_path: Path) -> None:
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    settings = AgentSettings(
        region=REGION, registry=REDIS_URL, registry_prefix=prefix, lease_ttl=2.0, probe_interval=0.25,
        probe_timeout=1.5, pool={"model": "tiny", "versions": {"v1": str(tiny_model), "v2": str(tiny_model)},
                                 "state_dir": str(tmp_path / "pool"), "engine_args": ["--enable-fault-admin"],
                                 "old_generation_grace": 1.0, "old_generation_drain_timeout": 600,
                                 "zones": {"z1": {"serving": 1, "warm": 0, "warm_previous": 0}}})
    snapshots = AliasSnapshots()
    snapshots.point("v1", 1)
    streaming: asyncio.Task | None = None
    async with ticking_agent(settings, snapshots=snapshots) as lab, \
            httpx.AsyncClient(timeout=httpx.Timeout(60.0)) as client:
        agent, registry, driver, shipper = lab.agent, lab.registry, lab.driver, lab.shipper
        try:
            def of(version: str, state: InstanceState) -> list[str]:
                return [i.instance_id for i in agent.instances.values() if i.version == version and i.state is state]

            async def leased() -> list[str]:
                return sorted(lease.version for lease in await registry.live())

            async def serving(version: str) -> bool:
                return len(of(version, InstanceState.SERVING)) == 1 and version in await leased()

            await until(lambda: serving("v1"), "v1 serves")
            [old] = of("v1", InstanceState.SERVING)
            url = agent.instances[old].url
            reference = await stream_tokens(client, url)  # the same greedy request, undisturbed
            assert len(reference) == MAX_TOKENS

            (await client.post(f"{url}/admin/faults", json={"token_delay_ms": 250})).raise_for_status()
            first_token = asyncio.Event()
            streaming = asyncio.create_task(stream_tokens(client, url, first_token))
            await asyncio.wait_for(first_token.wait(), 60)

            snapshots.point("v2", 2)  # promote: v2 loads, serves the plan, the grace runs out

            def waits_on_the_stream() -> bool:
                instance = agent.instances.get(old)
                return instance is not None and instance.in_flight == 1 and \
                    agent.metrics.registry.get_sample_value("lifeline_agent_roll_waiting_instances") == 1

            await until(waits_on_the_stream, "the roll, past the grace, waits for the old version's stream")
            assert await serving("v2") and not streaming.done()
            await asyncio.sleep(2 * settings.pool.old_generation_grace.total_seconds())  # well past it, still there
            assert driver.alive(old) and old in agent.instances and not streaming.done()
            assert not [e for e in shipper.buffer if e.kind == "pool.stopped" and e.instance_id == old]

            (await client.post(f"{url}/admin/faults", json={})).raise_for_status()  # decode at full speed again
            assert await asyncio.wait_for(streaming, 120) == reference  # token-identical, nothing cut or resumed

            def retired() -> list:
                return [e for e in shipper.buffer if e.kind == "pool.stopped" and e.instance_id == old]

            [stopped] = await until(retired, "the old version's instance is retired once its stream ended")
            assert (stopped.detail["drain_cut"], stopped.detail["in_flight"]) == (False, 0)
            await until(lambda: not driver.alive(old), "its process exits")
            assert await leased() == ["v2"]
            assert agent.metrics.registry.get_sample_value("lifeline_agent_roll_retired_total", {"drain": "idle"}) == 1
        finally:
            if streaming is not None:
                streaming.cancel()
                with contextlib.suppress(BaseException):
                    await streaming
