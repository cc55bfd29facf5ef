"""The agent's canaries and verdicts: which instance gets an inference probe now, and what its verdict is.

Moved out of warm_pool/agent.py unchanged; the agent owns one `Canaries` and
calls `start` each tick after the health probes. An admission canary (a
loading instance, or one about to be leased with no passing canary since its
last lease went) runs at once, outside the probe budget; the rest wait until
the budget says an instance is due. `judge` turns an instance's health and
last canary into one verdict and emits `probe.verdict` when it changes.
"""

from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING

import httpx

from common.logs import get_logger
from warm_pool.instance import Instance
from warm_pool.probe import EJECT, Verdict
from warm_pool.states import InstanceState

if TYPE_CHECKING:
    from warm_pool.agent import Agent

log = get_logger(__name__)

PROBE_RATE_WINDOW_S = 60.0  # lifeline_agent_inference_probe_rate_per_second averages over this


class Canaries:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self._sent: collections.deque[float] = collections.deque()  # when, within PROBE_RATE_WINDOW_S

    def start(self) -> None:
        agent = self.agent
        admission, routine = [], []
        for instance in agent.instances.values():
            if instance.canary_task is not None or agent.canary_for(instance.version) is None:
                continue
            if instance.health is None or not instance.health.ok:
                continue
            (admission if self._needs_admission(instance) else routine).append(instance)
        budgeted = [i for i in agent.instances.values() if agent.canary_for(i.version) is not None]
        agent.metrics.budget.set(agent.budget.rate(len(budgeted)))
        due = set(agent.budget.due([i.instance_id for i in budgeted]))
        now = agent.clock.now()
        for instance in admission + [i for i in routine if i.instance_id in due]:
            instance.canary_task = asyncio.create_task(self._run(instance), name=f"canary-{instance.instance_id}")
            self._sent.append(now)
        while self._sent and self._sent[0] <= now - PROBE_RATE_WINDOW_S:
            self._sent.popleft()
        agent.metrics.probe_rate.set(len(self._sent) / PROBE_RATE_WINDOW_S)

    def _needs_admission(self, instance: Instance) -> bool:
        """An admission canary (at once, outside the budget): a loading instance, or one the agent would lease
        that has no passing canary since its last lease went. A failing one waits for routine canaries."""
        if instance.state is InstanceState.COLD:
            return True
        if instance.lease is not None or instance.origin == "registry" or self._fresh(instance):
            return False
        if instance.canary is None:
            return instance.origin == "external" or instance.released_seq is not None
        return instance.canary.ok

    def _fresh(self, instance: Instance) -> bool:
        """A canary has answered since the agent last let the instance's lease go."""
        return instance.canary is not None and (instance.released_seq is None or
                                                instance.canary_seq > instance.released_seq)

    async def _run(self, instance: Instance) -> None:
        agent = self.agent
        record = agent.canary_for(instance.version)
        started = agent.next_seq()
        try:
            if record is None:
                return
            result = await agent.prober.canary(instance.url, model=instance.version, record=record,
                                               timeout=self.timeout())
            instance.canary, instance.canary_seq = result, started
            instance.canary_at = agent.clock.utcnow()
            instance.canaries += 1
            agent.metrics.instance_canaries.labels(instance.instance_id).set(instance.canaries)
            if result.verdict is Verdict.WRONG_OUTPUT:
                instance.wrong_outputs += 1
                agent.metrics.instance_wrong_outputs.labels(instance.instance_id).set(instance.wrong_outputs)
            agent.metrics.canaries.labels(result.verdict.value).inc()
            self.judge(instance)
            if instance.verdict in EJECT | {Verdict.DRAINING} and instance.lease is not None:
                await agent.release(instance)  # at once, not at the next tick
        except Exception:  # a canary never takes the agent down
            log.exception("canary failed", instance=instance.instance_id)
        finally:
            if instance.canary_task is asyncio.current_task():
                instance.canary_task = None

    def judge(self, instance: Instance) -> None:
        agent = self.agent
        health, canary = instance.health, instance.canary
        if health is None:
            return
        if not health.ok:
            verdict, reason, level = health.verdict, health.reason, health.level
        elif canary is not None and not canary.ok:
            verdict, reason, level = canary.verdict, canary.reason, canary.level
        else:
            verdict, reason, level = Verdict.OK, (canary or health).reason, (canary or health).level
        before = instance.verdict
        instance.reason = reason
        if verdict is before:
            return
        instance.verdict = verdict
        instance.verdict_since = agent.clock.utcnow()
        if instance.state is InstanceState.COLD and verdict is not Verdict.OK and level != "canary":
            return  # still loading: not a change anyone routes on
        agent.emit("probe.verdict", instance, f"{before or 'unprobed'} → {verdict}: {reason}",
                   verdict=verdict.value, before=before.value if before else None, level=level,
                   canary_probes=instance.canaries, seen_for_s=round(agent.clock.now() - instance.first_seen, 3),
                   origin=instance.origin, version=instance.version,
                   changes_routing=_routing_class(before) != _routing_class(verdict))

    def admitted(self, instance: Instance) -> bool:
        """Routable now, and (with a canary record) a canary passed since the agent last held its lease."""
        if instance.verdict is not Verdict.OK:
            return False
        record = self.agent.canary_for(instance.version)
        return record is None or (self._fresh(instance) and instance.canary is not None and instance.canary.ok)

    def timeout(self) -> httpx.Timeout:
        """A canary's own timeouts: a busy engine accepts and answers late, which is overloaded, not dead."""
        canary = self.agent.settings.canary_timeout.total_seconds()
        return httpx.Timeout(connect=min(2.0, canary), read=canary, write=canary, pool=canary)


def _routing_class(verdict: Verdict | None) -> str:
    """What a gateway does with a verdict: the event says whether that changed (routing_tier l7 either way)."""
    if verdict is None or verdict in EJECT:
        return "out"
    return {Verdict.OVERLOADED: "de-weighted", Verdict.DRAINING: "no new sessions",
            Verdict.OLD_GENERATION: "no new sessions"}.get(verdict, "routed")
