"""Streaming to engines over vLLM's HTTP API, on a lean HTTP/1.1 client.

Timeouts are split: `connect_timeout` for the TCP connect, then the stream
itself is watched token by token — `first_token_timeout` until the first
token (prefill, response headers included), `stall_timeout` between tokens —
because a hung engine keeps its socket open and only silence tells; a late
token on an engine that has left routing ends the stream sooner (`watch`).
Every way an engine can fail mid-way becomes an `EngineFailure` with a reason
the recovery policy understands — an "abort" finish and output without token
ids among them: only `stop`, `length` and tool-call finishes end a stream; a
4xx is the client's fault and becomes `EngineRejected`, never a migration.

Frames are checked against the generation we routed to: an engine that
answers with another `X-Lifeline-Generation` is not the endpoint we chose (a
restart behind the same address), and its frames are dropped.

Why not httpx: every token crossed httpx-sse, httpx's text decoder, httpcore,
h11 and an anyio cancel scope, with a pause/resume of the socket reader per
read; that was about a third of the gateway's CPU per token, and on a machine
shared with the engine that CPU is taken from decoding. Here one
`asyncio.Protocol` per connection parses with httptools (the C parser uvicorn
uses) and splits SSE events as bytes arrive; the stream coroutine wakes once
per event. A stream that ends early closes its connection, so the engine sees
the hang-up and stops decoding; a completed one is kept alive for reuse.
"""

from __future__ import annotations

import asyncio
import math
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from contract.engine_support import missing_token_ids
from contract.identity import DRAINING_ERROR_TYPE
from gateway.engine_connection import (
    ABORTED,
    DRAINING,
    FINAL_FINISH_REASONS,
    LEFT_ROUTING,
    NO_TOKEN_IDS,
    OVERLOADED,
    Connector,
    EngineFailure,
    EngineRejected,
    EngineToken,
    Opened,
    _Connection,
    _tcp_connector,
)
from gateway.router import Endpoint

__all__ = ["ABORTED", "DRAINING", "LEFT_ROUTING", "NO_TOKEN_IDS", "EngineClient", "EngineFailure", "EngineRejected",
           "EngineToken", "Opened", "Watch"]

# Asked when a token is late (never per token): why the endpoint has left routing, or None while it is routable.
Watch = Callable[[], Awaitable[str | None]]

@dataclass(frozen=True)
class _Target:
    key: tuple[str, int, bool]
    path: str
    host_header: str


class EngineClient:
    """Streams completions from engines; keeps idle connections per engine address for reuse."""

    def __init__(self, *, connect_timeout: float, connector: Connector | None = None, max_idle_per_engine: int = 256) -> None:
        self.connect_timeout = connect_timeout
        self.connector = connector or _tcp_connector
        self.max_idle_per_engine = max_idle_per_engine
        self.drain_timeout = 1.0
        # Engines (uvicorn, vLLM) close keep-alive connections idle for 5 s; reuse well before that.
        self.idle_expiry = 2.0
        self._idle: dict[tuple[str, int, bool], list[_Connection]] = {}
        self._targets: dict[str, _Target] = {}

    async def close(self) -> None:
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()

    def _target(self, url: str) -> _Target:
        target = self._targets.get(url)
        if target is None:
            parts = urlsplit(url)
            tls = parts.scheme == "https"
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise EngineFailure("connect", f"not an http(s) engine URL: {url!r}")
            port = parts.port or (443 if tls else 80)
            target = self._targets[url] = _Target((parts.hostname, port, tls), parts.path.rstrip("/") + "/v1/completions", parts.netloc)
        return target

    async def _connect(self, target: _Target, *, fresh: bool = False) -> _Connection:
        idle = self._idle.get(target.key)
        now = asyncio.get_running_loop().time()
        while idle and not fresh:
            connection = idle.pop()
            if connection.closed or connection.transport.is_closing() or now - connection.idle_since > self.idle_expiry:  # type: ignore[union-attr]
                connection.close()
                continue
            connection.idle = False
            connection.reused = True
            return connection
        host, port, tls = target.key
        connection = _Connection(self, target.key)
        try:
            async with asyncio.timeout(self.connect_timeout):
                await self.connector(lambda: connection, host, port, tls)
        except TimeoutError:
            raise EngineFailure("timeout", f"connect to {host}:{port} took over {self.connect_timeout:.2f}s") from None
        except OSError as exc:
            raise EngineFailure("connect", str(exc)) from None
        return connection

    @staticmethod
    async def _send(connection: _Connection, request: bytes, deadline: float) -> None:
        """Write the request; wait for the response headers (and the whole body of an error)."""
        connection.transport.write(request)  # type: ignore[union-attr]
        while not connection.headers_done:
            if connection.failure is not None:
                raise connection.failure
            await connection.wait(deadline)
        if connection.status >= 400:
            while not connection.complete:
                if connection.failure is not None:
                    raise connection.failure
                await connection.wait(deadline)

    def _give_back(self, connection: _Connection) -> None:
        if not connection.reusable():
            connection.close()
            return
        idle = self._idle.setdefault(connection.key, [])
        if len(idle) >= self.max_idle_per_engine:
            connection.close()
            return
        connection._reset()
        connection.idle = True
        connection.idle_since = asyncio.get_running_loop().time()
        idle.append(connection)

    def _drain_expired(self, connection: _Connection) -> None:
        if connection.draining:
            connection.draining = False
            connection.close()

    def _forget(self, connection: _Connection) -> None:
        idle = self._idle.get(connection.key)
        if idle and connection in idle:
            idle.remove(connection)

    async def stream(
        self, endpoint: Endpoint, payload: dict[str, Any], *, first_token_timeout: float, stall_timeout: float,
        attempt_id: str, watch: Watch | None = None, watch_after: float = 0.3, traceparent: str | None = None,
    ) -> AsyncIterator[Opened | EngineToken]:
        """Yield `Opened`, then one `EngineToken` per token, until the finishing token.

        Only `FINAL_FINISH_REASONS` end the stream; any other finish (vLLM's
        "abort") is an `EngineFailure(ABORTED)` after the chunk's tokens, and
        a chunk with output but no token ids is `EngineFailure(NO_TOKEN_IDS)`.

        `attempt_id` goes out as `X-Request-Id` (vLLM's request id header), so the
        engine's logs carry the gateway's request id; `traceparent`, where tracing
        is on, as W3C's header of that name.

        `watch`: once a token after the first is `watch_after` late, and then
        every `watch_after` until the stall timeout, the stream asks it whether
        the endpoint has left routing; if it has, the stream fails at once with
        `EngineFailure(LEFT_ROUTING)` instead of waiting out `stall_timeout`
        (a SIGTERMed vLLM that stops sending and keeps the socket open). A
        token on time costs nothing more than without a watch.
        """
        target = self._target(endpoint.url)
        continuous_usage = bool((payload.get("stream_options") or {}).get("continuous_usage_stats"))
        body = json.dumps(payload, separators=(",", ":")).encode()
        request = (b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
                   b"User-Agent: lifeline-gateway\r\nX-Request-Id: %s\r\n%sContent-Length: %d\r\n\r\n%s"
                   % (target.path.encode(), target.host_header.encode(), attempt_id.encode(),
                      b"traceparent: %s\r\n" % traceparent.encode() if traceparent else b"", len(body), body))
        deadline = asyncio.get_running_loop().time() + first_token_timeout
        connection = await self._connect(target)
        finished = False
        try:
            try:
                try:
                    await self._send(connection, request, deadline)
                except EngineFailure:
                    if not (connection.reused and not connection.received):
                        raise
                    # A kept-alive connection the engine closed as idle while we picked it: nothing of
                    # ours was answered, so this is no engine failure. Once more on a new connection.
                    connection.close()
                    connection = await self._connect(target, fresh=True)
                    await self._send(connection, request, deadline)
            except TimeoutError:
                raise EngineFailure("stall", f"no response within {first_token_timeout:.2f}s") from None
            status = connection.status
            if status >= 400:
                raw = bytes(connection.body)
                if status < 500 and status not in (408, 429):
                    raise EngineRejected(status, _json_or_text(raw))
                retry_after = _float_or_none(connection.headers.get(b"retry-after"))
                raise EngineFailure(OVERLOADED if status == 429 else f"http_{status}",
                                    raw[:200].decode(errors="replace"), retry_after_s=retry_after)
            generation = _int_or_none(connection.headers.get(b"x-lifeline-generation"))
            if endpoint.generation is not None and generation is not None and generation != endpoint.generation:
                raise EngineFailure("stale_generation", f"routed to generation {endpoint.generation}, engine is {generation}")
            if not connection.sse:
                content_type = connection.headers.get(b"content-type", b"").decode(errors="replace")
                raise EngineFailure("bad_response", f"not a vLLM completion stream: content-type {content_type!r}")
            yield Opened(generation)
            timeout = wait = first_token_timeout
            between = min(stall_timeout, watch_after) if watch is not None else stall_timeout
            while True:
                try:
                    data = await connection.next_event(wait)
                except TimeoutError:
                    if wait >= timeout:
                        raise EngineFailure("stall", f"no token within {timeout:.2f}s") from None
                    data = await _late_event(connection, endpoint, watch, watch_after, timeout - wait)  # type: ignore[arg-type]
                if data is None:
                    raise EngineFailure("stream_ended", "engine closed the stream before the last token")
                timeout, wait = stall_timeout, between
                if data == b"[DONE]":
                    raise EngineFailure("stream_ended", "[DONE] before a finish_reason")
                try:
                    chunk = json.loads(data)
                    if "error" in chunk:
                        error = chunk["error"]
                        reason = DRAINING if error.get("type") == DRAINING_ERROR_TYPE else "engine_error"
                        raise EngineFailure(reason, str(error.get("message", "")))
                    choice = chunk["choices"][0]
                    finish = engine_finish = choice.get("finish_reason")
                    token_ids = choice.get("token_ids") or []
                    if finish is not None and finish not in FINAL_FINISH_REASONS:
                        finish = None  # the chunk's tokens are real output; the stream is not over for the client
                    elif not token_ids and (finish is not None or choice.get("text")):
                        raise EngineFailure(NO_TOKEN_IDS, missing_token_ids(f"{endpoint.instance_id} ({endpoint.url})"))
                    last = len(token_ids) - 1
                    tokens = [EngineToken(int(token_id), finish if i == last else None) for i, token_id in enumerate(token_ids)]
                    if tokens and (usage := chunk.get("usage")):  # continuous_usage_stats: sessions ask for it
                        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                        if cached is not None:
                            tokens[0] = EngineToken(tokens[0].token_id, tokens[0].finish_reason, int(cached))
                except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
                    raise EngineFailure("bad_response", f"not a vLLM completion stream: {exc}") from None
                finished = finish is not None
                if finished and continuous_usage and tokens[0].cached_tokens is None:
                    # vLLM puts prompt_tokens_details only in the usage chunk after the finish: read it first
                    cached = await _trailing_cached_tokens(connection, min(stall_timeout, TRAILING_USAGE_WAIT))
                    if cached is not None:
                        tokens[-1] = EngineToken(tokens[-1].token_id, tokens[-1].finish_reason, cached)
                for token in tokens:
                    yield token
                if finished:
                    return
                if engine_finish is not None:
                    raise EngineFailure(ABORTED, f"the engine ended the stream with finish_reason {engine_finish!r} "
                                                 "(a shutdown, a preemption or lost KV cut it short)")
        finally:
            # Complete and keep-alive: reuse. After the last token, the end of the response ([DONE],
            # the last chunk) is usually still in flight: reuse once it lands, close if it does not
            # within `drain_timeout`. Anything else (a failure, a client that left) closes the
            # socket at once, and the engine stops decoding for it.
            if finished and not connection.complete and connection.failure is None and not connection.closed:
                connection.draining = True
                connection.drain_timer = asyncio.get_running_loop().call_later(self.drain_timeout, self._drain_expired, connection)
            else:
                self._give_back(connection)


async def _late_event(connection: _Connection, endpoint: Endpoint, watch: Watch, every: float, left: float) -> bytes | None:
    """A token is late: ask `watch` every `every` seconds until it comes, the endpoint leaves routing, or `left` runs out."""
    loop = asyncio.get_running_loop()
    end = loop.time() + left
    waited = every
    while True:
        why = await watch()
        if why is not None:
            raise EngineFailure(LEFT_ROUTING, f"{endpoint.instance_id} generation {endpoint.generation} sent nothing for "
                                              f"{waited:.2f}s after it left routing ({why})")
        remaining = end - loop.time()
        if remaining <= 0:
            raise EngineFailure("stall", f"no token within {waited:.2f}s")
        try:
            return await connection.next_event(min(every, remaining))
        except TimeoutError:
            waited += min(every, remaining)


def _float_or_none(value: bytes | None) -> float | None:
    """A Retry-After in seconds (the HTTP-date form is not one an engine sends); None if absent or not a number."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and math.isfinite(seconds) and seconds >= 0 else None


def _int_or_none(value: bytes | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _json_or_text(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
        if isinstance(body, dict):
            return body
    except ValueError:
        pass
    return {"error": {"message": raw[:500].decode(errors="replace"), "type": "invalid_request_error", "param": None, "code": 400}}


TRAILING_USAGE_WAIT = 0.5  # seconds a finished stream waits for vLLM's usage chunk before it ends without it


async def _trailing_cached_tokens(connection: Any, wait: float) -> int | None:
    """`usage.prompt_tokens_details.cached_tokens` of the chunks after a stream's finish, up to `[DONE]`.

    vLLM sends what it restored instead of prefilling (its prefix cache, a KV connector) only there, with
    `--enable-prompt-tokens-details`; the reference engine sends it on its first chunk, so it is not read
    here. None when no such chunk comes within `wait` (the finish still ends the stream)."""
    deadline = asyncio.get_running_loop().time() + wait
    while (left := deadline - asyncio.get_running_loop().time()) > 0:
        try:
            data = await connection.next_event(left)
        except (TimeoutError, EngineFailure):  # the answer is whole already: what follows it cannot fail it
            return None
        if data is None or data == b"[DONE]":
            return None
        try:
            cached = ((json.loads(data).get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
        except (ValueError, AttributeError):
            return None
        if cached is not None:
            return int(cached)
    return None
