"""The regional agent's verdicts, as gateways read them: one record per region in the lease registry's Redis.

The agent judges every instance of its region (warm_pool/probe.py); a lease
carries only "live or not", so before this a gateway saw a verdict only when
the agent let an agent-held lease go. An engine that renews its own lease
kept being routed whatever the agent found, and `overloaded`, `draining`
and `old_generation` changed nothing anywhere. The board closes that gap:

    agent ──publish(board)──► {prefix}:{region}:verdicts ◄──read()── gateway replicas

Key layout, beside the leases' (contract/lease.py), same prefix and region:

    {prefix}:{region}:verdicts    a `VerdictBoard` as JSON, PX expiry `ttl`

The agent writes the whole board every probe interval (one SET, the board
replaces the last, one writer per region) with an expiry of one lease TTL,
so verdicts of an agent that died lapse as its leases do, and gateways fall
back to leases alone: the board can only take endpoints away from routing,
never add one (a verdict without a live lease routes nothing). A board
names only instances that are not `ok`.

What a gateway does with each verdict (`GATEWAY_ACTION`):

    timeout, error, wrong_output     eject: no new requests, as a lapsed lease
    overloaded                       de-weight: a smaller share of new sessions
    draining, old_generation         no new sessions; established streams finish

A verdict applies to the `(instance_id, generation)` it names: a restarted
engine (a new generation) starts clean (invariant 1).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

import redis.asyncio as aioredis
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from common.logs import get_logger
from contract.events import Verdict

log = get_logger(__name__)

Action = Literal["eject", "deweight", "no_new_sessions"]
GATEWAY_ACTION: dict[str, Action] = {
    "timeout": "eject", "error": "eject", "wrong_output": "eject",
    "overloaded": "deweight",
    "draining": "no_new_sessions", "old_generation": "no_new_sessions",
}


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)  # ignore: a newer agent may add fields


class InstanceVerdict(_Record):
    instance_id: str = Field(min_length=1, max_length=200)
    generation: int = Field(description="the lease generation judged; another generation is another endpoint")
    verdict: Verdict
    reason: str = Field("", max_length=500)
    since: datetime | None = None

    @property
    def action(self) -> Action | None:
        return GATEWAY_ACTION.get(self.verdict)


class VerdictBoard(_Record):
    region: str
    agent_id: str
    published_at: datetime
    verdicts: list[InstanceVerdict] = Field(default_factory=list, max_length=10_000)

    def actions(self) -> dict[tuple[str, int], Action]:
        """(instance_id, generation) → what a gateway does; instances not named are routed as their lease says."""
        return {(v.instance_id, v.generation): action for v in self.verdicts if (action := v.action) is not None}


def verdicts_key(region: str, prefix: str = "lifeline") -> str:
    return f"{prefix}:{region}:verdicts"


class RedisVerdictBoard:
    """Publish (the agent) and read (gateways) one region's board in the lease registry's Redis."""

    def __init__(self, client: aioredis.Redis, *, region: str, prefix: str = "lifeline") -> None:
        self.redis = client
        self.region = region
        self.key = verdicts_key(region, prefix)

    async def publish(self, board: VerdictBoard, *, ttl: timedelta) -> None:
        if board.region != self.region:
            raise ValueError(f"a board of region {board.region!r} on {self.region!r}'s registry")
        await self.redis.set(self.key, board.model_dump_json(), px=max(1, int(ttl.total_seconds() * 1000)))

    async def read(self) -> VerdictBoard | None:
        """The board, or None when there is none (no agent, or it lapsed) or it is not one (logged)."""
        raw = await self.redis.get(self.key)
        if raw is None:
            return None
        try:
            return VerdictBoard.model_validate_json(raw)
        except ValidationError as exc:
            log.warning("verdict board unreadable; routing by leases alone", key=self.key, error=str(exc)[:200])
            return None
