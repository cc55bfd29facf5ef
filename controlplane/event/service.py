"""Write and read events. Never commits; the caller's unit of work does."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from controlplane.clock import Clock
from controlplane.event import repository
from controlplane.event.models import Event, RoutingTier
from controlplane.event.repository import EventFilter
from controlplane.event.schemas import EventRead


def record(
    session: Session,
    *,
    kind: str,
    actor: str,
    reason: str,
    scope: str,
    clock: Clock,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    routing_tier: RoutingTier | None = None,
    outcome: str = "succeeded",
    started_at: datetime | None = None,
) -> Event:
    now = clock.now()
    event = Event(
        kind=kind,
        routing_tier=routing_tier.value if routing_tier else None,
        actor=actor,
        reason=reason,
        scope=scope,
        before=before,
        after=after,
        outcome=outcome,
        started_at=started_at or now,
        ended_at=now,
    )
    session.add(event)
    session.flush()
    return event


def list_events(session: Session, flt: EventFilter, *, limit: int = 100) -> Sequence[Event]:
    return repository.list_events(session, flt, limit=limit)


def export_jsonl(session: Session, flt: EventFilter, *, page: int = 500) -> Iterator[str]:
    """Every matching event, one JSON object per line, oldest first, paged by id."""
    after_id = flt.after_id
    while True:
        batch = repository.list_events(
            session,
            EventFilter(**{**flt.__dict__, "after_id": after_id}),
            limit=page,
        )
        for event in batch:
            yield json.dumps(EventRead.model_validate(event).model_dump(mode="json"), sort_keys=True) + "\n"
        if len(batch) < page:
            return
        after_id = batch[-1].id
