from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from contract.routing_tier import RoutingTier
from controlplane.event.models import Event


@dataclass(frozen=True)
class EventFilter:
    kind: str | None = None
    routing_tier: RoutingTier | None = None
    actor: str | None = None
    scope_prefix: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    after_id: int | None = None


def _query(flt: EventFilter) -> Select[tuple[Event]]:
    query = select(Event).order_by(Event.id)
    if flt.kind is not None:
        query = query.where(Event.kind == flt.kind)
    if flt.routing_tier is not None:
        query = query.where(Event.routing_tier == flt.routing_tier.value)
    if flt.actor is not None:
        query = query.where(Event.actor == flt.actor)
    if flt.scope_prefix is not None:
        escaped = flt.scope_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        query = query.where(Event.scope.like(escaped + "%", escape="\\"))
    if flt.since is not None:
        query = query.where(Event.started_at >= flt.since)
    if flt.until is not None:
        query = query.where(Event.started_at < flt.until)
    if flt.after_id is not None:
        query = query.where(Event.id > flt.after_id)
    return query


def list_events(session: Session, flt: EventFilter, *, limit: int) -> Sequence[Event]:
    return session.scalars(_query(flt).limit(limit)).all()
