"""The event timeline: the log filtered by routing_tier, scope and actor, and kept live by server-sent events.

The page lists the last 24 hours through `controlplane.event.service.list_events`
(newest first), and opens `/console/events/stream`, which polls the same
service with `after_id` once a second and sends each new event as a rendered
row (`event: lifeline-event`, `id: <event id>`). EventSource reconnects by
itself with `Last-Event-ID`, so a dropped connection resumes after the last
row it showed, gap-free; the stream also ends itself after `STREAM_LIFETIME`
so no connection is held forever, and re-checks the session on every poll, so
signing out or revoking the token ends it.

Rejected: htmx's SSE extension (one more vendored file for what twenty lines
of EventSource do) and a websocket (the log is one-way).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Annotated, Any
from urllib.parse import urlencode

import anyio
from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import Response, StreamingResponse

from contract.routing_tier import RoutingTier
from controlplane.console import session as console_session
from controlplane.console.web import (
    ENV,
    SECURITY_HEADERS,
    current_user,
    key,
    problem,
    render,
    to_sign_in,
)
from controlplane.event import service as event_service
from controlplane.event.models import Event
from controlplane.event.repository import EventFilter

router = APIRouter()

WINDOW = timedelta(hours=24)
PAGE_LIMIT = 500
POLL_INTERVAL_S = 1.0
KEEPALIVE_EVERY = 15  # polls
STREAM_LIFETIME_POLLS = 600  # ~10 minutes; the browser reconnects with Last-Event-ID

FilterText = Annotated[str | None, Query(max_length=400, pattern=r"^[^\x00]*$")]


def link_for(event: Event) -> tuple[str, str] | None:
    """The cutover or drill that wrote an event: (href, label), or None."""
    for body in (event.after or {}, event.before or {}):
        if isinstance(body, dict) and isinstance(body.get("cutover_id"), int):
            return f"/console/cutovers/{body['cutover_id']}", f"cutover #{body['cutover_id']}"
    if event.kind.startswith("drill.") and isinstance((event.after or {}).get("run"), int):
        run = event.after["run"]  # type: ignore[index]
        return f"/console/drills/runs/{run}", f"drill run #{run}"
    source = (event.after or {}).get("generator_url")
    if event.kind.startswith("alert.") and isinstance(source, str) and source.startswith(("http://", "https://")):
        return source, "the alert's query"  # Prometheus' graph of the expression that fired
    return None


def _filter(routing_tier: str | None, scope: str | None, actor: str | None, kind: str | None, *,
            since: Any = None, after_id: int | None = None) -> EventFilter:
    return EventFilter(kind=kind or None, routing_tier=RoutingTier(routing_tier) if routing_tier else None,
                       actor=actor or None, scope_prefix=scope or None, since=since, after_id=after_id)


def render_row(event: Event) -> str:
    return ENV.get_template("_event_row.jinja").render(event=event, link=link_for(event))


def _timeline_context(request: Request, routing_tier: str | None, scope: str | None, actor: str | None,
                      kind: str | None) -> dict[str, Any]:
    state = request.app.state
    since = state.clock.utcnow() - WINDOW
    with state.read_session_factory() as session:
        rows = list(event_service.list_events(session, _filter(routing_tier, scope, actor, kind, since=since),
                                              limit=PAGE_LIMIT))
    last_id = rows[-1].id if rows else 0
    query = {k: v for k, v in (("routing_tier", routing_tier), ("scope", scope), ("actor", actor),
                               ("kind", kind)) if v}
    stream = "/console/events/stream?" + urlencode({**query, "after_id": last_id})
    return {"events": [(e, link_for(e)) for e in reversed(rows)], "stream_url": stream, "filters": query,
            "tiers": [t.value for t in RoutingTier], "truncated": len(rows) >= PAGE_LIMIT}


def _tier_ok(routing_tier: str | None) -> bool:
    return routing_tier in (None, "") or routing_tier in {t.value for t in RoutingTier}


@router.get("/console/events", include_in_schema=False, name="console.events")
def events(request: Request, routing_tier: FilterText = None, scope: FilterText = None, actor: FilterText = None,
           kind: FilterText = None) -> Response:
    user = current_user(request)
    if user is None:
        return to_sign_in(request)
    if not _tier_ok(routing_tier):
        allowed = ", ".join(t.value for t in RoutingTier)
        return problem(request, user=user, status_code=422, error_type="invalid_request",
                       message=f"routing_tier: {routing_tier!r} is none of {allowed}", back="/console/events")
    context = _timeline_context(request, routing_tier, scope, actor, kind)
    # htmx swaps only the timeline when a filter changes; a plain GET (no JavaScript) gets the whole page.
    template = "_timeline.jinja" if request.headers.get("HX-Request") == "true" else "events.jinja"
    return render(request, template, user=user, section="events", **context)


@router.get("/console/events/stream", include_in_schema=False, name="console.events_stream")
async def stream(
    request: Request,
    routing_tier: FilterText = None, scope: FilterText = None, actor: FilterText = None, kind: FilterText = None,
    after_id: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=20)] = None,
) -> Response:
    user = await anyio.to_thread.run_sync(current_user, request)
    if user is None:
        return Response("sign in first", status_code=401, media_type="text/plain", headers=SECURITY_HEADERS)
    if not _tier_ok(routing_tier):
        return Response("unknown routing_tier", status_code=422, media_type="text/plain", headers=SECURITY_HEADERS)
    resumable = last_event_id and last_event_id.isascii() and last_event_id.isdigit()  # not "²": int() refuses it
    start = min(int(last_event_id), 2**63 - 1) if resumable else after_id
    cookie = request.cookies.get(console_session.SESSION_COOKIE)
    # Within the page's window too: a stream that starts at 0 (an empty page) sends new events, not the history.
    since = request.app.state.clock.utcnow() - WINDOW
    frames = sse_frames(request, _filter(routing_tier, scope, actor, kind, since=since), start=start, cookie=cookie)
    headers = {**SECURITY_HEADERS, "X-Accel-Buffering": "no"}
    return StreamingResponse(frames, media_type="text/event-stream", headers=headers)


def poll(request: Request, flt: EventFilter, *, after_id: int, cookie: str | None) -> list[Event] | None:
    """New events after `after_id`, or None once the session is no longer valid (signed out, expired, revoked)."""
    state = request.app.state
    with state.read_session_factory() as session:
        if console_session.resolve(session, key(request), cookie, now=state.clock.wall()) is None:
            return None
        return list(event_service.list_events(session, EventFilter(**{**flt.__dict__, "after_id": after_id}),
                                              limit=200))


def frame(event: Event) -> str:
    # One `data:` line per line of the row, as the SSE format requires.
    data = "\n".join(f"data: {line}" for line in render_row(event).splitlines() if line.strip())
    return f"id: {event.id}\nevent: lifeline-event\n{data}\n\n"


async def sse_frames(request: Request, flt: EventFilter, *, start: int, cookie: str | None,
                     polls: int = STREAM_LIFETIME_POLLS) -> AsyncIterator[str]:
    last = start
    yield "retry: 2000\n\n"
    for tick in range(polls):
        if await request.is_disconnected():
            return
        rows = await anyio.to_thread.run_sync(functools.partial(poll, request, flt, after_id=last, cookie=cookie))
        if rows is None:
            yield "event: signed-out\ndata: sign in again\n\n"
            return
        for event in rows:
            last = event.id
            yield frame(event)
        if not rows and tick % KEEPALIVE_EVERY == KEEPALIVE_EVERY - 1:
            yield ": keepalive\n\n"
        # A poll cadence for an I/O loop, not domain time: the injected clock does not apply.
        await anyio.sleep(POLL_INTERVAL_S)
