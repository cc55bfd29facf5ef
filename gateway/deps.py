"""What a stream session works with, and the ownership heartbeat it keeps while it drives a stream."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from common.clock import Clock
from common.logs import get_logger
from gateway.engine_client import EngineClient
from gateway.metrics import GatewayMetrics
from gateway.report import ServedLedger
from gateway.router import Router
from gateway.settings import GatewaySettings
from gateway.token_log import TokenLog
from gateway.tracing import Tracing

if TYPE_CHECKING:
    from gateway.sessions import SessionKeeper

log = get_logger(__name__)


@dataclass
class Deps:
    settings: GatewaySettings
    router: Router
    engines: EngineClient
    token_log: TokenLog
    metrics: GatewayMetrics
    clock: Clock
    replica_id: str
    served: ServedLedger = field(default_factory=ServedLedger)  # streams finished OK, for the report
    sessions: SessionKeeper | None = None  # session turns and their KV checkpoints (gateway/sessions.py)
    tracing: Tracing = field(default_factory=Tracing)  # off unless settings.tracing.enabled (gateway/tracing.py)


async def hold_ownership(deps: Deps, request_id: str, epoch: Callable[[], int]) -> None:
    """Keep this replica's ownership of a stream fresh while it drives it (cancel the task to stop)."""
    ttl = deps.settings.token_log.owner_ttl.total_seconds()
    while True:
        await asyncio.sleep(ttl / 3)
        try:
            await deps.token_log.refresh_owner(request_id, deps.replica_id, epoch())
        except Exception as exc:  # Redis blip: the next beat may succeed; losing ownership is fenced anyway
            log.warning("owner heartbeat failed", request_id=request_id, error=str(exc))
