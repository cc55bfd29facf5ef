"""What the agent tells others: events, the verdict board, its report to the control plane, its metrics.

Moved out of warm_pool/agent.py unchanged; the agent owns one
`AgentReporting` and keeps thin methods of the same names (`emit`,
`verdicts`, `publish_verdicts`, `report`, `send_report`, `status`) that the
reconciler, the CLI loops and the tests call. Each of these only reads the
agent's instances: nothing here changes a verdict or a lease.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from common.logs import get_logger
from contract.events import AgentInstance, AgentReport, DataPlaneEvent
from contract.verdict import InstanceVerdict, VerdictBoard
from warm_pool.instance import Instance
from warm_pool.probe import Verdict

if TYPE_CHECKING:
    from warm_pool.agent import Agent

log = get_logger(__name__)


class AgentReporting:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def emit(self, kind: str, instance: Instance, reason: str, **detail: str | int | float | bool | None) -> None:
        agent = self.agent
        agent.shipper.emit(DataPlaneEvent(
            kind=kind, routing_tier="l7", actor=agent.actor, region=agent.settings.region,  # type: ignore[arg-type]
            instance_id=instance.instance_id,
            generation=instance.lease.generation if instance.lease is not None else instance.generation,
            reason=reason[:2000], at=agent.clock.utcnow(),
            detail={"zone": instance.zone, "version": instance.version, **detail}))

    def export_metrics(self) -> None:
        agent = self.agent
        agent.metrics.leases.set(sum(1 for i in agent.instances.values() if i.lease is not None))
        if agent.settings.pool is not None:
            agent.metrics.instances.clear()
            for instance in agent.instances.values():
                if instance.origin == "pool" and instance.state is not None:
                    agent.metrics.instances.labels(instance.zone, instance.state.value).inc()

    def verdicts(self) -> VerdictBoard:
        """The board gateways route by: every routed instance whose verdict is not ok, under its generation.

        An instance without a lease is left out: nothing routes to it anyway (the agent released it, or it lapsed).
        """
        agent = self.agent
        named = []
        for i in agent.instances.values():
            generation = i.lease.generation if i.lease is not None else i.generation if i.origin == "registry" else None
            if i.verdict is None or i.verdict is Verdict.OK or generation is None:
                continue
            named.append(InstanceVerdict(instance_id=i.instance_id, generation=generation, verdict=i.verdict.value,
                                         reason=i.reason[:500], since=i.verdict_since))
        return VerdictBoard(region=agent.settings.region, agent_id=agent.agent_id, published_at=agent.clock.utcnow(),
                            verdicts=named)

    async def publish_verdicts(self) -> None:
        """Replace the region's board; it lapses one lease TTL after the last, as the agent's leases do."""
        agent = self.agent
        if agent.verdict_board is None:
            return
        board = self.verdicts()
        try:
            await agent.verdict_board.publish(board, ttl=agent.settings.lease_ttl)
        except Exception as exc:  # Redis away: the last board lapses on its own, the safe side (leases alone)
            agent.metrics.board_failures.inc()
            log.warning("verdict board not published", error=str(exc)[:200])
            return
        agent.metrics.board.clear()
        for v in board.verdicts:
            agent.metrics.board.labels(v.verdict).inc()

    def report(self) -> AgentReport:
        """What the agent sees now, for the control plane (`PUT /api/v1/agents/{region}`)."""
        agent = self.agent
        return AgentReport(
            region=agent.settings.region, agent_id=agent.agent_id, sent_at=agent.clock.utcnow(),
            snapshot_version=agent.snapshot.version if agent.snapshot else None,
            snapshot_epoch=agent.snapshot.controlplane_epoch if agent.snapshot else None,
            instances=[AgentInstance(
                instance_id=i.instance_id, zone=i.zone, version=i.version, url=i.url, origin=i.origin,
                pool_state=i.state.value if i.state else None, verdict=i.verdict.value if i.verdict else None,
                verdict_reason=i.reason[:2000], verdict_since=i.verdict_since, lease_held=i.lease is not None,
                lease_generation=i.lease.generation if i.lease else i.generation if i.origin == "registry" else None,
                canary_verdict=i.canary.verdict.value if i.canary else None, canary_at=i.canary_at,
                canaries=i.canaries) for i in agent.instances.values()],
            staging=agent.staging.report() if agent.staging is not None else None)

    async def send_report(self) -> str:
        """Build and send the report; its outcome is counted (lifeline_agent_reports_total{outcome})."""
        outcome = await self.agent.reporter.send(self.report())
        self.agent.metrics.reports.labels(outcome).inc()
        return outcome

    def status(self) -> dict:
        """What the agent believes, for tests and benches (the control plane shows its report: GET /api/v1/agents)."""
        agent = self.agent
        return {"snapshot_version": agent.snapshot.version if agent.snapshot else None,
                "instances": {i.instance_id: {"url": i.url, "zone": i.zone, "version": i.version, "origin": i.origin,
                                              "state": i.state.value if i.state else None,
                                              "verdict": i.verdict.value if i.verdict else None, "reason": i.reason,
                                              "generation": i.lease.generation if i.lease else None,
                                              "canaries": i.canaries, "wrong_outputs": i.wrong_outputs,
                                              "stock_vllm": i.stock_vllm, "supported": i.supported,
                                              "unleasable": i.unleasable}
                              for i in agent.instances.values()},
                "faults": {"open": {scope: entry.fault.fault_id for scope, entry in agent.faults.open.items()},
                           "reported": {fault_id: outcome for fault_id, (outcome, _) in
                                        agent.fault_reports.outcomes.items()},
                           "unreported": sorted(agent.fault_reports.unreported)},
                "canary_rollbacks": {f"{m}:{a}@{r}": outcome for (m, a, r), (outcome, _) in
                                     agent.rollback_reports.outcomes.items()}}
