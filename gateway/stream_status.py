"""The status of one stream in the token log: one enum, one table, one pure `transition()`.

Both token logs obey this table: `MemoryTokenLog` calls `transition()`, and the
Redis log's Lua scripts are built from the same table (`LUA_TRANSITIONS`), so
the rules cannot drift apart; `tests/integration/gateway/test_gateway_stream_status_lua.py`
drives the scripts through every (status, event) pair and compares.

    ACTIVE ──detach──► DETACHED ──advance (resume)──► ACTIVE
      │ ▲                 │
      │ └─advance─────────┤          advance: migration, resume or takeover;
      ├──finish──► FINISHED ◄─finish─┤          the epoch grows by one
      ├──fail────► FAILED   ◄─fail───┤
      └──cancel──► CANCELLED ◄─cancel┘          cancel: the epoch grows by one

Terminal states (FINISHED, FAILED, CANCELLED) accept only their own event
again, which changes nothing (idempotent); frames are appended only while
the stream is not terminal.
"""

from __future__ import annotations

from enum import StrEnum

from gateway.errors import GatewayError


class StreamStatus(StrEnum):
    ACTIVE = "active"  # a replica is (or was, until its ownership lapsed) driving it
    DETACHED = "detached"  # the client left; engine work was cancelled; resumable
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


class StreamEvent(StrEnum):
    ADVANCE = "advance"  # epoch CAS: migration to another engine, client resume, takeover by another replica
    DETACH = "detach"  # the client hung up mid-stream
    FINISH = "finish"
    FAIL = "fail"
    CANCEL = "cancel"  # DELETE /v1/streams/{id}; wins over any later migration


TERMINAL = frozenset({StreamStatus.FINISHED, StreamStatus.FAILED, StreamStatus.CANCELLED})
EPOCH_EVENTS = frozenset({StreamEvent.ADVANCE, StreamEvent.CANCEL})

_S, _E = StreamStatus, StreamEvent
TRANSITIONS: dict[tuple[StreamStatus, StreamEvent], StreamStatus] = {
    (_S.ACTIVE, _E.ADVANCE): _S.ACTIVE,
    (_S.DETACHED, _E.ADVANCE): _S.ACTIVE,
    (_S.ACTIVE, _E.DETACH): _S.DETACHED,
    (_S.DETACHED, _E.DETACH): _S.DETACHED,
    (_S.ACTIVE, _E.FINISH): _S.FINISHED,
    (_S.DETACHED, _E.FINISH): _S.FINISHED,
    (_S.FINISHED, _E.FINISH): _S.FINISHED,
    (_S.ACTIVE, _E.FAIL): _S.FAILED,
    (_S.DETACHED, _E.FAIL): _S.FAILED,
    (_S.FAILED, _E.FAIL): _S.FAILED,
    (_S.ACTIVE, _E.CANCEL): _S.CANCELLED,
    (_S.DETACHED, _E.CANCEL): _S.CANCELLED,
    (_S.CANCELLED, _E.CANCEL): _S.CANCELLED,
}


class InvalidTransition(GatewayError):
    status_code = 409
    error_type = "invalid_transition"


def transition(status: StreamStatus, event: StreamEvent) -> StreamStatus:
    """The status after `event`; InvalidTransition if the table has no such move."""
    try:
        return TRANSITIONS[(status, event)]
    except KeyError:
        raise InvalidTransition(f"a {status} stream cannot {event}") from None


def advances_epoch(status: StreamStatus, event: StreamEvent) -> bool:
    """Whether an allowed `event` in `status` moves the request epoch (a repeated terminal event does not)."""
    return event in EPOCH_EVENTS and not status.terminal


def _lua_table() -> str:
    rows = []
    for status in StreamStatus:
        moves = ", ".join(f"{event.value}='{to.value}'" for (src, event), to in TRANSITIONS.items() if src is status)
        rows.append(f"{status.value}={{{moves}}}")
    terminal = ", ".join(f"{s.value}=true" for s in StreamStatus if s.terminal)
    return f"local T = {{{', '.join(rows)}}}\nlocal TERMINAL = {{{terminal}}}\n"


LUA_TRANSITIONS = _lua_table()  # prepended to every token-log script: `T[status][event]` is the next status or nil
