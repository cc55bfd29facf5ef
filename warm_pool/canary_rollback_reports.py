"""The agent's canary-rollback reports: a non-prod alias whose version failed its canary everywhere is posted.

Moved out of warm_pool/agent.py unchanged; the agent owns one
`CanaryRollbackReports` and calls `report` each tick. Which versions failed is
warm_pool/canary_rollback.py; this posts them, one at a time in the
background (the catalog answers once the alias has moved), and remembers the
outcome per alias revision so each is posted once.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from common.logs import get_logger
from warm_pool.canary_rollback import CanaryFailure, CanaryOutcome, failed_versions

if TYPE_CHECKING:
    from warm_pool.agent import Agent

log = get_logger(__name__)


class CanaryRollbackReports:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.outcomes: dict[tuple[str, str, int], tuple[str, object]] = {}  # alias revision → outcome
        self.task: asyncio.Task | None = None

    def failures(self) -> list[CanaryFailure]:
        """Non-prod aliases whose version failed its canary on every instance of it that answered one."""
        outcomes = [CanaryOutcome(i.instance_id, i.version, i.canary.verdict.value, i.canary.reason)
                    for i in self.agent.instances.values() if i.canary is not None]
        return [f for f in failed_versions(self.agent.snapshot, outcomes) if f.key not in self.outcomes]

    def report(self) -> None:
        """Post them in the background (one at a time): the catalog answers once the alias has moved."""
        if not self.agent.settings.canary_rollback or (self.task is not None and not self.task.done()):
            return
        failures = self.failures()
        if failures:
            self.task = asyncio.create_task(self._send(failures), name="canary-rollbacks")

    async def _send(self, failures: list[CanaryFailure]) -> None:
        for failure in failures:
            try:
                outcome, answer = await self.agent.rollback_reporter.send(failure)
            except Exception as exc:  # a report never takes the agent down; the next round tries again
                log.exception("canary failure report failed", alias=failure.alias, version=failure.version)
                outcome, answer = "retry", repr(exc)[:300]
            self.agent.metrics.canary_rollbacks.labels(outcome).inc()
            if outcome == "retry":
                log.info("canary failure not reported yet", alias=failure.alias, version=failure.version, why=answer)
                continue
            self.outcomes[failure.key] = (outcome, answer)
            level = log.warning if outcome == "accepted" else log.error if outcome == "refused" else log.info
            level("canary failure reported: alias rolled back" if outcome == "accepted" else
                  "canary failure not acted on", model=failure.model, alias=failure.alias, version=failure.version,
                  revision=failure.revision, instances=list(failure.instances), outcome=outcome, answer=str(answer)[:300])
