"""The agent's health probes: live / ready / generation on every instance each round, and restarts under a lease.

Moved out of warm_pool/agent.py unchanged; the agent owns one `HealthProbes`
and calls `probe` each tick after it observes. Every probe is bounded by
`probe_timeout` and they run concurrently, so one hung engine costs a round no
more than that — at most `probe_concurrency` at once, each timed from when it
is sent. Unbounded, a round of 333 engines queued in the HTTP client's pool of
100 connections, whose hand-out scans every queued request against every
connection; the probes waiting there ran out their timeout unsent, and the
agent judged every healthy engine of its region `timeout` (bench/fleet.py,
issue 29). Stock vLLM has no /healthz/*: it is also judged by the
progress its /metrics shows (warm_pool/progress.py), read in the background
because a busy API server answers late.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from common.logs import get_logger
from warm_pool.instance import Instance
from warm_pool.probe import ProbeResult, Verdict
from warm_pool.progress import judge_progress

if TYPE_CHECKING:
    from warm_pool.agent import Agent

log = get_logger(__name__)


class HealthProbes:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    async def probe(self) -> None:
        agent = self.agent
        timeout = agent.settings.probe_timeout.total_seconds()
        versions, digests = agent.expected_versions(), agent.expected_digests()
        targets = list(agent.instances.values())

        slots = asyncio.Semaphore(agent.settings.probe_concurrency)

        async def one(instance: Instance) -> ProbeResult:
            metrics = self._read_progress(instance) if instance.stock_vllm else None
            try:
                async with slots:
                    result = await asyncio.wait_for(agent.prober.health(instance.url, expected_versions=versions,
                                                                        expected_digests=digests,
                                                                        stock_vllm=instance.stock_vllm), timeout)
            except TimeoutError:
                result = ProbeResult(Verdict.TIMEOUT, "live", f"health probes took over {timeout:g} s",
                                     stock_vllm=instance.stock_vllm)
            if result.stock_vllm and metrics is None:
                metrics = self._read_progress(instance)  # just found out it is stock vLLM
            if metrics is not None:
                # the /metrics read may outlive this probe (a busy API server): wait for it no longer than
                # the health probe may take, and judge by the freshest sample there is
                await asyncio.wait({metrics}, timeout=max(0.0, timeout - (agent.clock.now() - started)))
                result = judge_progress(result, instance.progress, now=agent.clock.now(),
                                        stall_timeout=agent.settings.stall_timeout.total_seconds(),
                                        busy_grace=agent.settings.busy_grace.total_seconds())
            return result

        async def in_flight(instance: Instance) -> None:
            """For the version roll: it retires an old instance once nothing runs or waits there."""
            try:
                async with slots:
                    instance.in_flight = await asyncio.wait_for(agent.prober.in_flight(instance.url), timeout)
            except TimeoutError:
                instance.in_flight = None

        awaited = [i for i in targets if i.drain_waiting_since is not None]
        started = agent.clock.now()
        results, _ = await asyncio.gather(asyncio.gather(*(one(i) for i in targets)),
                                          asyncio.gather(*(in_flight(i) for i in awaited)))
        for instance, result in zip(targets, results, strict=True):
            instance.health = result
            instance.stock_vllm = instance.stock_vllm or result.stock_vllm
            instance.failed_probes = 0 if result.ok or result.verdict is Verdict.OVERLOADED \
                else instance.failed_probes + 1
            if result.identity is not None and result.identity.model != instance.version:
                instance.version = result.identity.model
            boot = None
            if result.identity is not None:
                boot = (result.identity.boot_generation, result.identity.started_at)
            elif instance.stock_vllm and instance.progress.last is not None and \
                    instance.progress.last.started_at is not None:
                boot = (0, instance.progress.last.started_at)  # vLLM's process_start_time_seconds
            if boot is not None:
                if instance.boot is not None and boot != instance.boot:
                    await self._restarted(instance, instance.boot, boot)
                instance.boot = boot
            agent.metrics.probes.labels(result.verdict.value).inc()
            agent.canaries.judge(instance)

    def _read_progress(self, instance: Instance) -> asyncio.Task:
        """The instance's /metrics read in flight, or a new one; each finished read is added to its progress.

        Not bounded by the probe timeout: a busy API server answers late, and a late sample is still
        evidence of progress. Bounded by `busy_grace`, past which a sample proves nothing anyway.
        """
        task = instance.metrics_task
        if task is not None and not task.done():
            return task

        async def read() -> None:
            sample = await self.agent.prober.engine_metrics(instance.url,
                                                            timeout=self.agent.settings.busy_grace.total_seconds())
            if sample is not None:
                instance.progress.add(sample)

        instance.metrics_task = asyncio.create_task(read(), name=f"metrics-{instance.instance_id}")
        return instance.metrics_task

    async def _restarted(self, instance: Instance, before: tuple[int, float], after: tuple[int, float]) -> None:
        """Another process answers at the instance's url: release its lease; a new one only after a fresh canary.

        An engine without a lease of its own sends no generation header, so the gateway cannot fence a
        restart at the same url; the lease holder does, from `boot_generation` and `started_at`.
        """
        log.warning("engine restarted under its lease", instance=instance.instance_id, before=before, after=after)
        if instance.canary_task is not None:
            instance.canary_task.cancel()  # its answer may be the old process's
            instance.canary_task = None
        instance.canary = None
        instance.unleasable = None
        instance.supported = False  # another process: it may be another vLLM, with or without Lifeline's sampler
        await self.agent.release(instance)
        instance.released_seq = self.agent.next_seq()
