"""The regional agent's verdicts as this replica last read them, for the router.

The agent publishes one board per region beside the leases
(`contract.verdict`); this view re-reads it every `registry.refresh_interval`
and answers, per endpoint `(instance_id, generation)`, what the router does:

    eject              not routed to (timeout, error, wrong_output), as if its lease had lapsed
    deweight           routed to with `admission.overloaded_weight` of a healthy endpoint's share
    no_new_sessions    no new requests or migrations (draining, old_generation); streams on it finish

An endpoint the board does not name is routed as its lease says. When the
board lapses (the agent is gone) every endpoint is: the board only takes
capacity away, so losing it is the state before it existed, never worse.
A read that fails keeps the last board (as the lease view fails static).

Metrics: `lifeline_gateway_agent_verdicts{action}` (endpoints the last
board names, by action), `lifeline_gateway_agent_board_age_seconds`.
"""

from __future__ import annotations

import asyncio
import contextlib

from prometheus_client import CollectorRegistry, Gauge

from common.clock import Clock
from common.logs import get_logger
from contract.verdict import GATEWAY_ACTION, Action, RedisVerdictBoard, VerdictBoard

log = get_logger(__name__)

EndpointKey = tuple[str, int | None]


class VerdictView:
    def __init__(self, board: RedisVerdictBoard, *, refresh_interval: float, clock: Clock,
                 metrics_registry: CollectorRegistry | None = None) -> None:
        self.board = board
        self.refresh_interval = refresh_interval
        self.clock = clock
        self.last: VerdictBoard | None = None
        self._actions: dict[tuple[str, int], Action] = {}
        self._task: asyncio.Task | None = None
        r = metrics_registry or CollectorRegistry()
        self.m_verdicts = Gauge("lifeline_gateway_agent_verdicts", "Endpoints the agent's last verdict board names",
                                ["action"], registry=r)
        self.m_age = Gauge("lifeline_gateway_agent_board_age_seconds", "Seconds since the agent published the board "
                           "this replica routes by", registry=r)
        for action in sorted(set(GATEWAY_ACTION.values())):
            self.m_verdicts.labels(action).set(0)

    def action(self, key: EndpointKey) -> Action | None:
        instance_id, generation = key
        return None if generation is None else self._actions.get((instance_id, generation))

    async def refresh(self) -> bool:
        try:
            board = await self.board.read()
        except Exception as exc:  # noqa: BLE001 - keep the last board; Redis may be back next tick
            log.warning("verdict board unreadable; routing on the last one", error=(str(exc) or type(exc).__name__)[:200])
            return False
        actions = board.actions() if board is not None else {}
        if actions != self._actions:
            log.info("agent verdicts changed", agent=board.agent_id if board else None,
                     ejected=sorted(k[0] for k, a in actions.items() if a == "eject"),
                     deweighted=sorted(k[0] for k, a in actions.items() if a == "deweight"),
                     no_new_sessions=sorted(k[0] for k, a in actions.items() if a == "no_new_sessions"))
        self.last, self._actions = board, actions
        for action in sorted(set(GATEWAY_ACTION.values())):
            self.m_verdicts.labels(action).set(sum(1 for a in actions.values() if a == action))
        self.m_age.set(max(0.0, (self.clock.utcnow() - board.published_at).total_seconds()) if board else 0)
        return True

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._loop(), name="verdict-board-refresh")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_interval)
            await self.refresh()
