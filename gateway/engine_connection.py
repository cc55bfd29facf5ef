"""One HTTP/1.1 connection to an engine, parsed in `asyncio.Protocol` callbacks, and what it yields.

`EngineClient` (engine_client.py) pools these and drives a request over one;
this module is the byte level: httptools parses the response as it arrives,
SSE events are split as bytes come in, and the stream coroutine waits on one
future per event. Why not httpx: see engine_client.py.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httptools

if TYPE_CHECKING:
    from gateway.engine_client import EngineClient

__all__ = ["ABORTED", "DRAINING", "FINAL_FINISH_REASONS", "LEFT_ROUTING", "NO_TOKEN_IDS", "OVERLOADED",
           "EngineFailure", "EngineRejected", "EngineToken", "Opened"]

# `EngineFailure.reason`s the session and the router treat apart from the rest:
DRAINING = "engine_draining"  # a planned shutdown: migrate without spending the retry budget
ABORTED = "engine_aborted"  # the engine ended the stream with a finish the client did not ask for (vLLM's "abort")
NO_TOKEN_IDS = "no_token_ids"  # output without per-token ids: the engine cannot say what it committed (too old)
LEFT_ROUTING = "engine_left_routing"  # silent after its lease went or the agent marked it draining: routing moved it
OVERLOADED = "engine_overloaded"  # a 429: the engine's queue is full; busy, not broken (no outlier ejection)

# The finishes that end a stream as the client asked: the stop condition, the token budget, a tool call. vLLM
# also ends streams with "abort" (shutdown, preemption, lost KV) and others with "error": those are failures,
# and the stream continues elsewhere, never a truncated answer passed off as a finished one.
FINAL_FINISH_REASONS = frozenset({"stop", "length", "tool_calls", "function_call"})


class EngineFailure(Exception):
    """The engine could not finish the stream; `reason` feeds metrics and the policy."""

    def __init__(self, reason: str, detail: str = "", *, retry_after_s: float | None = None) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.retry_after_s = retry_after_s  # the engine's Retry-After, where it answered one


class EngineRejected(Exception):
    def __init__(self, status_code: int, body: dict[str, Any]) -> None:
        super().__init__(f"engine answered {status_code}")
        self.status_code = status_code
        self.body = body


@dataclass(frozen=True, slots=True)
class Opened:
    """Response headers arrived: the engine accepted the request."""

    generation: int | None


@dataclass(frozen=True, slots=True)
class EngineToken:
    token_id: int
    finish_reason: str | None
    cached_tokens: int | None = None  # the chunk's usage.prompt_tokens_details.cached_tokens, when it carried one


# (host, port, ssl) → how to open a transport to it; tests substitute an in-memory one.
Connector = Callable[[Callable[[], asyncio.Protocol], str, int, bool], Any]


async def _tcp_connector(factory: Callable[[], asyncio.Protocol], host: str, port: int, ssl: bool) -> Any:
    return await asyncio.get_running_loop().create_connection(factory, host, port, ssl=ssl or None)


_MAX_BUFFERED_EVENTS = 256  # pause reading the engine's socket beyond this; a stuck client must not grow memory


def _sse_data(block: bytes) -> bytes | None:
    """The `data` of one SSE event block (lines joined by newlines), or None if it has none."""
    if block.startswith(b"data: ") and b"\n" not in block:
        return block[6:]  # the engine's shape: one data line per event
    data = [line[5:].removeprefix(b" ") for line in block.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(data) if data else None


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection to an engine, one request at a time; parsed in the protocol callbacks."""

    def __init__(self, pool: EngineClient, key: tuple[str, int, bool]) -> None:
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle = False
        self.idle_since = 0.0
        self.reused = False  # served an earlier request: the engine may be closing it as idle right now
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.received = False
        self.headers: dict[bytes, bytes] = {}
        self.headers_done = False
        self.sse = False
        self.complete = False
        self.keep_alive = False
        self.body = bytearray()
        self.pending = b""
        self.events: deque[bytes] = deque()
        self.failure: EngineFailure | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.paused = False
        self.draining = False  # the last token is in; waiting for the end of the response to reuse the connection
        self.drain_timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ---------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.failure = EngineFailure("connection_lost", f"malformed HTTP from the engine: {exc}")
            self.close()
        if self.events and not self.paused and len(self.events) > _MAX_BUFFERED_EVENTS and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.idle:
            self.pool._forget(self)
        elif self.draining:
            self.draining = False
        elif not self.complete and self.failure is None:
            self.failure = EngineFailure("connection_lost", str(exc) if exc else "the engine closed the connection mid-response")
        self._wake()

    # -- httptools callbacks -------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.headers_done = True
        self.sse = self.status < 400 and self.headers.get(b"content-type", b"").startswith(b"text/event-stream")

    def on_body(self, body: bytes) -> None:
        if not self.sse:
            self.body += body
            return
        buffer = self.pending + body if self.pending else body
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n")
        *blocks, self.pending = buffer.split(b"\n\n")
        for block in blocks:
            data = _sse_data(block)
            if data is not None:
                self.events.append(data)

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()  # only meaningful inside the callback
        if self.draining:
            self.draining = False
            self.drain_timer.cancel()  # type: ignore[union-attr]
            asyncio.get_running_loop().call_soon(self.pool._give_back, self)

    # -- the request side ------------------------------------------------------------
    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, deadline: float) -> None:
        """Until the protocol makes progress; TimeoutError at `deadline` (loop time)."""
        loop = asyncio.get_running_loop()
        waiter = self.waiter = loop.create_future()
        timer = loop.call_at(deadline, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self.waiter = None

    async def next_event(self, timeout: float) -> bytes | None:
        """The next SSE event's data; None once the response is complete."""
        deadline = None
        while True:
            if self.events:
                data = self.events.popleft()
                if self.paused and len(self.events) < _MAX_BUFFERED_EVENTS // 2 and not self.closed:
                    self.paused = False
                    self.transport.resume_reading()  # type: ignore[union-attr]
                return data
            if self.failure is not None:
                raise self.failure
            if self.complete:
                return None
            if deadline is None:
                deadline = asyncio.get_running_loop().time() + timeout
            await self.wait(deadline)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed and self.failure is None


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())
