"""The agent's zone and region faults: one detector round per tick, each new fault posted once for cutover.

Moved out of warm_pool/agent.py unchanged; the agent owns one `FaultReports`
and calls `detect` then `report` each tick. The detector itself is
warm_pool/fault.py. Posting runs in the background because the answer waits
for the cutover it starts; a fault that clears before it is taken is not
posted, and one not taken yet is posted again under the same id, which
resumes its ladder.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from common.logs import get_logger
from warm_pool.fault import Fault, Observation, RoundResult

if TYPE_CHECKING:
    from warm_pool.agent import Agent

log = get_logger(__name__)


class FaultReports:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.outcomes: dict[str, tuple[str, object]] = {}  # fault id → (outcome, the answer), reported ones
        self.unreported: dict[str, Fault] = {}  # opened, not yet accepted or refused
        self.task: asyncio.Task | None = None

    def detect(self) -> RoundResult:
        """One round for the fault detector: every instance's verdict, and the ones lost this round as gone."""
        agent = self.agent
        observations = [Observation(i.instance_id, i.zone, i.verdict.value if i.verdict else None, i.reason,
                                    i.lease.generation if i.lease else i.generation)
                        for i in agent.instances.values()] + agent.lost_this_round
        agent.lost_this_round = []
        result = agent.faults.observe(observations, agent.clock.utcnow())
        for fault in result.opened:
            agent.metrics.faults.labels(fault.kind).inc()
            self.unreported[fault.fault_id] = fault
            log.warning("fault detected", fault_id=fault.fault_id, scope=fault.scope, rounds=fault.evidence["rounds"],
                        instances=[i["instance_id"] for i in fault.evidence["instances"]])
        for fault in result.cleared:
            self.unreported.pop(fault.fault_id, None)
            log.info("fault cleared", fault_id=fault.fault_id, scope=fault.scope)
        agent.metrics.open_faults.clear()
        for entry in agent.faults.open.values():
            agent.metrics.open_faults.labels(entry.fault.kind).inc()
        return result

    def report(self) -> None:
        """Post the faults not yet taken, in the background: the answer waits for the cutover it starts."""
        if self.unreported and (self.task is None or self.task.done()):
            self.task = asyncio.create_task(self._send(list(self.unreported.values())), name="fault-reports")

    async def _send(self, faults: list[Fault]) -> None:
        for fault in faults:
            if fault.fault_id not in self.unreported:
                continue  # cleared meanwhile: no cutover for a fault that is gone
            try:
                outcome, answer = await self.agent.fault_reporter.send(fault)
            except Exception as exc:  # a report never takes the agent down; the next round tries again
                log.exception("fault report failed", fault_id=fault.fault_id)
                outcome, answer = "retry", repr(exc)[:300]
            self.agent.metrics.fault_reports.labels(outcome).inc()
            if outcome == "retry":
                log.info("fault not reported yet; the same id again resumes its ladder", fault_id=fault.fault_id,
                         why=answer)
                continue
            self.unreported.pop(fault.fault_id, None)
            self.outcomes[fault.fault_id] = (outcome, answer)
            if outcome == "accepted":
                actions = [d.get("action") for d in (answer or {}).get("decisions", [])] if isinstance(answer, dict) \
                    else []
                log.warning("fault reported for automatic cutover", fault_id=fault.fault_id, scope=fault.scope,
                            actions=actions)
            elif outcome == "disabled":
                log.warning("fault not reported: no control plane is configured", fault_id=fault.fault_id,
                            scope=fault.scope)
            else:
                log.error("fault not reported", fault_id=fault.fault_id, scope=fault.scope, outcome=outcome,
                          why=answer)
