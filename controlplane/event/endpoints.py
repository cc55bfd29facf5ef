from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from contract.events import EventBatch
from contract.routing_tier import RoutingTier
from controlplane.auth.dependencies import DataPlaneReporter, Viewer
from controlplane.auth.roles import Role
from controlplane.db import DbSession
from controlplane.deps import ClockDep
from controlplane.event import dataplane, service
from controlplane.event.repository import EventFilter
from controlplane.event.schemas import EventRead

router = APIRouter(tags=["events"])

Text = Annotated[str | None, Query(max_length=400, pattern=r"^[^\x00]*$")]


def _filter(
    kind: Text = None,
    routing_tier: RoutingTier | None = None,
    actor: Text = None,
    scope: Text = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> EventFilter:
    return EventFilter(kind=kind, routing_tier=routing_tier, actor=actor, scope_prefix=scope, since=since, until=until)


@router.get("/events", response_model=list[EventRead])
def list_events(
    session: DbSession,
    _: Viewer,
    kind: Text = None,
    routing_tier: RoutingTier | None = None,
    actor: Text = None,
    scope: Annotated[str | None, Query(max_length=400, pattern=r"^[^\x00]*$", description="scope prefix")] = None,
    since: datetime | None = None,
    until: datetime | None = None,
    after_id: Annotated[int | None, Query(ge=0, le=2**31 - 1)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[EventRead]:
    flt = _filter(kind, routing_tier, actor, scope, since, until)
    flt = EventFilter(**{**flt.__dict__, "after_id": after_id})
    return [EventRead.model_validate(e) for e in service.list_events(session, flt, limit=limit)]


@router.get(
    "/events/export",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-ndjson": {}}, "description": "one event per line"}},
)
def export_events(
    request: Request,
    _: Viewer,
    kind: Text = None,
    routing_tier: RoutingTier | None = None,
    actor: Text = None,
    scope: Text = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> StreamingResponse:
    """Every matching event as JSON lines, oldest first, streamed a page at a time."""
    flt = _filter(kind, routing_tier, actor, scope, since, until)
    # Not the request's DbSession, which closes when this returns, before
    # the body is sent: the stream reads through a session of its own.
    # A sync iterator, so Starlette pulls each page in a worker thread.
    lines = service.stream_jsonl(request.app.state.read_session_factory, flt)
    return StreamingResponse(lines, media_type="application/x-ndjson")


class BatchAccepted(BaseModel):
    recorded: int


@router.post("/events/dataplane", status_code=202, response_model=BatchAccepted)
def record_dataplane_events(body: EventBatch, session: DbSession, principal: DataPlaneReporter,
                            clock: ClockDep) -> BatchAccepted:
    """A gateway's or agent's automatic L7 actions, into the event log (`routing_tier`, its actor).

    The whole batch is written or none of it (422 if any event's actor is
    not the token's: `gateway:<name>` for a gateway token, `agent:<region>`
    for an agent token, either for an admin); its `dropped` count becomes one
    `dataplane.events_dropped` event.
    """
    prefixes = {Role.GATEWAY: ("gateway:",), Role.AGENT: ("agent:",)}.get(principal.role, dataplane.ACTOR_PREFIXES)
    recorded = dataplane.record_batch(session, batch=body, reported_by=principal.actor, clock=clock,
                                      actor_prefixes=prefixes)
    return BatchAccepted(recorded=recorded)
