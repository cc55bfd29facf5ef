"""Write and read events. Never commits; the caller's unit of work does."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from common.clock import Clock
from controlplane.event import repository
from controlplane.event.models import Event
from contract.routing_tier import RoutingTier
from controlplane.event.repository import EventFilter
from controlplane.event.schemas import EventRead
from common.errors import error_body
from common.logs import get_logger

log = get_logger(__name__)


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
    now = clock.utcnow()
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


def stream_jsonl(factory: sessionmaker[Session], flt: EventFilter, *, page: int = 500) -> Iterator[str]:
    """`export_jsonl` on a session of its own, for a streamed response.

    Nothing is read until the first line is asked for, at most one page is
    in memory, and the session is closed when the stream ends or is
    abandoned. The response has already started when a page fails, so the
    failure becomes a last line `{"error": {"type", "message"}}` (the
    shape of every other error) and the stream ends: a reader can tell a
    cut-short export from a complete one.
    """
    session = factory()
    try:
        yield from export_jsonl(session, flt, page=page)
    except Exception as exc:
        log.error("event_export_failed", error=repr(exc))
        yield json.dumps(error_body("export_failed", "the export stopped early")) + "\n"
    finally:
        session.close()
