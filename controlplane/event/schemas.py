from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from contract.routing_tier import RoutingTier


class EventRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    kind: str
    routing_tier: RoutingTier | None
    actor: str
    reason: str
    scope: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    outcome: str
    started_at: datetime
    ended_at: datetime
