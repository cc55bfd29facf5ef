"""The live timeline's server-sent events: new rows after the last one shown, and an end when the session does."""

from __future__ import annotations

from typing import Any

import anyio
from fastapi.testclient import TestClient

from common.clock import ManualClock
from contract.routing_tier import RoutingTier
from controlplane.auth import service as auth_service
from controlplane.console.events import sse_frames
from controlplane.db import session_scope
from controlplane.event import service as event_service
from controlplane.event.repository import EventFilter
from tests.integration.console.conftest import sign_in
from tests.support.controlplane_testing import ON_SQLITE

pytestmark = ON_SQLITE


class StreamRequest:
    """What sse_frames reads of a request: the app, and whether the client went away."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def is_disconnected(self) -> bool:
        return False


def record(session_factory: Any, clock: ManualClock, kind: str, tier: RoutingTier | None, scope: str) -> int:
    with session_scope(session_factory) as session:
        return event_service.record(session, kind=kind, actor="test", reason="r", scope=scope, clock=clock,
                                    routing_tier=tier, after={"cutover_id": 7} if kind == "cutover.step" else None).id


def frames(console: TestClient, flt: EventFilter, start: int) -> list[str]:
    cookie = console.cookies["lifeline_console"]

    async def collect() -> list[str]:
        return [f async for f in sse_frames(StreamRequest(console.app), flt, start=start, cookie=cookie, polls=1)]

    return anyio.run(collect)


def test_stream_sends_only_newer_matching_events_as_rows(console: TestClient, tokens: dict[str, str],
                                                         session_factory: Any, clock: ManualClock) -> None:
    sign_in(console, tokens["viewer"])
    seen = record(session_factory, clock, "cutover.step", RoutingTier.L7, "region:eu/zone:eu-a")
    new_l7 = record(session_factory, clock, "cutover.step", RoutingTier.L7, "region:eu/zone:eu-b")
    record(session_factory, clock, "cluster.update", RoutingTier.DNS, "region:eu/cluster:c")
    sent = frames(console, EventFilter(routing_tier=RoutingTier.L7), start=seen)
    rows = [f for f in sent if "event: lifeline-event" in f]
    assert len(rows) == 1
    assert rows[0].startswith(f"id: {new_l7}\nevent: lifeline-event\ndata: <tr id=\"event-{new_l7}\"")
    assert 'href="/console/cutovers/7"' in rows[0] and "region:eu/zone:eu-b" in rows[0]
    assert all(line.startswith(("id:", "event:", "data:")) for line in rows[0].strip().splitlines())


def test_stream_ends_when_the_token_is_revoked(console: TestClient, tokens: dict[str, str],
                                               session_factory: Any, clock: ManualClock) -> None:
    sign_in(console, tokens["operator"])
    with session_scope(session_factory) as session:
        auth_service.revoke_token(session, token_id=2, actor="test", clock=clock)
    record(session_factory, clock, "cutover.step", RoutingTier.L7, "region:eu")
    sent = frames(console, EventFilter(), start=0)
    assert sent[-1].startswith("event: signed-out")
    assert not any("lifeline-event" in f for f in sent)


def test_a_script_in_an_event_reason_is_escaped(console: TestClient, tokens: dict[str, str],
                                                session_factory: Any, clock: ManualClock) -> None:
    sign_in(console, tokens["viewer"])
    with session_scope(session_factory) as session:
        event_service.record(session, kind="note", actor="test", reason="<script>alert(1)</script>",
                             scope="region:eu", clock=clock)
    page = console.get("/console/events").text
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
