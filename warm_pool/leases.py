"""The leases the agent holds for engines that cannot renew their own (stock vLLM, pool instances).

Moved out of warm_pool/agent.py unchanged; the agent owns one `LeaseKeeper`
and calls `apply` each tick after the canaries start. A lease is registered
after the admission canary and the first-lease check (warm_pool/support.py),
renewed while the verdict keeps the instance routable, and released at once
otherwise, so an instance leaves routing within one TTL at most.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from common.logs import get_logger
from contract.lease import LeaseExpired, Registration, StaleGeneration
from warm_pool.instance import Instance
from warm_pool.probe import Verdict
from warm_pool.support import SupportUnknown, UnsupportedEngine, ask_sampling, check_token_ids

if TYPE_CHECKING:
    from warm_pool.agent import Agent

log = get_logger(__name__)

KEEPS_LEASE = frozenset({Verdict.OK, Verdict.OVERLOADED, Verdict.OLD_GENERATION})


class LeaseKeeper:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    async def apply(self) -> None:
        for instance in list(self.agent.instances.values()):
            if not instance.agent_leased:
                continue
            if instance.lease is not None and instance.verdict not in KEEPS_LEASE:
                await self.release(instance)
            elif instance.lease is not None:
                await self._renew(instance)
            elif self.agent.canaries.admitted(instance) and instance.unleasable is None:
                await self.register(instance)  # first lease, or again after a release or a lapse

    async def supported(self, instance: Instance) -> bool:
        """The first-lease check (warm_pool/support.py), once per instance: it streams per-token ids.

        Refused: `unleasable` names what is missing and the minimum vLLM version, an event and an error log
        say so, and it is never leased. No answer to judge (a timeout, a 5xx): not leased now, asked again.
        """
        agent = self.agent
        if instance.supported:
            return True
        if instance.unleasable is not None:
            return False
        try:
            await check_token_ids(agent.http, instance.url, model=instance.version, timeout=agent.canaries.timeout())
            instance.sampling = await ask_sampling(agent.http, instance.url, model=instance.version,
                                                   timeout=agent.canaries.timeout())
        except UnsupportedEngine as exc:
            instance.unleasable = f"{exc.error_type}: {exc.message}"
            instance.reason = instance.unleasable
            agent.metrics.unsupported.inc()
            log.error("engine refused: it cannot be leased", instance=instance.instance_id, url=instance.url,
                      error_type=exc.error_type, reason=exc.message)
            agent.emit("probe.verdict", instance, f"refused at its first lease: {instance.unleasable}",
                       verdict=Verdict.ERROR.value, before=instance.verdict.value if instance.verdict else None,
                       level="canary", error_type=exc.error_type, changes_routing=False)
            return False
        except SupportUnknown as exc:
            log.info("first-lease check got no answer; asking again before the next lease",
                     instance=instance.instance_id, why=str(exc))
            return False
        instance.supported = True
        log.info("engine supported", instance=instance.instance_id, sampling=instance.sampling.value)
        return True

    async def register(self, instance: Instance) -> None:
        if not await self.supported(instance):
            return
        try:
            instance.lease = await self.agent.registry.register(Registration(
                instance_id=instance.instance_id, url=instance.url, version=instance.version, zone=instance.zone,
                region=self.agent.settings.region, sampling=instance.sampling.value))
        except Exception as exc:
            log.warning("lease not registered", instance=instance.instance_id, error=str(exc)[:200])
            return
        log.info("lease registered for", instance=instance.instance_id, generation=instance.lease.generation)
        health = instance.health
        identity = health.identity if health else None
        if health is not None and health.stamps_generation and identity is not None and \
                identity.generation != instance.lease.generation:
            # It sends X-Lifeline-Generation: it holds a lease of its own and is listed here by mistake. The
            # gateway would drop every frame under the agent's generation as stale. Never route to it.
            # (An engine without a lease of its own sends no header and is leased under any generation.)
            instance.unleasable = (f"engine stamps generation {identity.generation} (a lease of its own); "
                                   f"the agent's lease would be {instance.lease.generation}")
            await self.release(instance)
            log.warning("lease refused: generations disagree", instance=instance.instance_id,
                        reason=instance.unleasable)

    async def _renew(self, instance: Instance) -> None:
        if instance.lease is None:
            return
        try:
            instance.lease = await self.agent.registry.renew(instance.instance_id, instance.lease.generation)
        except LeaseExpired:
            # Lapsed while the agent was slow: gateways stopped routing to it. Registered again (a new
            # generation) after a fresh admission canary; the engine sends no generation header to disagree.
            log.warning("lease lapsed", instance=instance.instance_id, generation=instance.lease.generation)
            instance.lease = None
            instance.released_seq = self.agent.next_seq()
        except StaleGeneration:
            log.warning("another writer holds this instance's lease; not renewing", instance=instance.instance_id)
            instance.lease = None
            instance.released_seq = self.agent.next_seq()
        except Exception as exc:  # registry away: the lease lapses on its own, which is the safe side
            log.warning("lease not renewed", instance=instance.instance_id, error=str(exc)[:200])

    async def release(self, instance: Instance) -> None:
        lease, instance.lease = instance.lease, None
        if lease is None:
            return
        instance.generation = lease.generation  # what the events that follow judged (it was routed under it)
        instance.released_seq = self.agent.next_seq()
        with contextlib.suppress(Exception):
            await self.agent.registry.release(lease.instance_id, lease.generation)
        log.info("lease released", instance=instance.instance_id, generation=lease.generation, verdict=instance.verdict)
