"""Streaming to engines over vLLM's HTTP API (httpx + httpx-sse).

Timeouts are split: `connect_timeout` for the TCP connect, then the stream
itself is watched token by token — `first_token_timeout` until the first
token (prefill), `stall_timeout` between tokens — because a hung engine keeps
its socket open and only silence tells. Every way an engine can fail mid-way
becomes an `EngineFailure` with a reason the recovery policy understands; a
4xx is the client's fault and becomes `EngineRejected`, never a migration.

Frames are checked against the generation we routed to: an engine that
answers with another `X-Lifeline-Generation` is not the endpoint we chose (a
restart behind the same address), and its frames are dropped.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import EventSource, SSEError

from gateway.router import Endpoint


class EngineFailure(Exception):
    """The engine could not finish the stream; `reason` feeds metrics and the policy."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class EngineRejected(Exception):
    def __init__(self, status_code: int, body: dict[str, Any]) -> None:
        super().__init__(f"engine answered {status_code}")
        self.status_code = status_code
        self.body = body


@dataclass(frozen=True)
class Opened:
    """Response headers arrived: the engine accepted the request."""

    generation: int | None


@dataclass(frozen=True)
class EngineToken:
    token_id: int
    finish_reason: str | None


class EngineClient:
    def __init__(self, *, connect_timeout: float) -> None:
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=connect_timeout, read=None, write=10.0, pool=connect_timeout),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=512),
        )

    async def close(self) -> None:
        await self.http.aclose()

    async def stream(
        self, endpoint: Endpoint, payload: dict[str, Any], *, first_token_timeout: float, stall_timeout: float
    ) -> AsyncIterator[Opened | EngineToken]:
        """Yield `Opened`, then one `EngineToken` per SSE chunk, until the finishing token."""
        try:
            async with self.http.stream("POST", f"{endpoint.url}/v1/completions", json=payload) as response:
                if response.status_code >= 400:
                    raw = await response.aread()
                    if 400 <= response.status_code < 500 and response.status_code not in (408, 429):
                        raise EngineRejected(response.status_code, _json_or_text(raw))
                    raise EngineFailure(f"http_{response.status_code}", raw[:200].decode(errors="replace"))
                generation = _int_or_none(response.headers.get("x-lifeline-generation"))
                if endpoint.generation is not None and generation is not None and generation != endpoint.generation:
                    raise EngineFailure("stale_generation", f"routed to generation {endpoint.generation}, engine is {generation}")
                yield Opened(generation)
                events = EventSource(response).aiter_sse()
                timeout = first_token_timeout
                while True:
                    try:
                        async with asyncio.timeout(timeout):
                            sse = await anext(events)
                    except StopAsyncIteration:
                        raise EngineFailure("stream_ended", "engine closed the stream before the last token") from None
                    except TimeoutError:
                        raise EngineFailure("stall", f"no token within {timeout:.2f}s") from None
                    timeout = stall_timeout
                    if sse.data == "[DONE]":
                        raise EngineFailure("stream_ended", "[DONE] before a finish_reason")
                    chunk = json.loads(sse.data)
                    if "error" in chunk:
                        raise EngineFailure("engine_error", str(chunk["error"].get("message", "")))
                    choice = chunk["choices"][0]
                    finish = choice.get("finish_reason")
                    token_ids = choice.get("token_ids") or []
                    for i, token_id in enumerate(token_ids):
                        yield EngineToken(int(token_id), finish if i == len(token_ids) - 1 else None)
                    if finish is not None:
                        return
        except httpx.ConnectError as exc:
            raise EngineFailure("connect", str(exc)) from None
        except httpx.TimeoutException as exc:
            raise EngineFailure("timeout", str(exc)) from None
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            raise EngineFailure("connection_lost", str(exc)) from None
        except (SSEError, ValueError, KeyError, IndexError) as exc:
            raise EngineFailure("bad_response", f"not a vLLM completion stream: {exc}") from None


def _int_or_none(value: str | None) -> int | None:
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
