"""Reading an engine's or gateway's SSE stream in tests, with httpx-sse."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from httpx_sse import connect_sse

from common import oneshot_http


@dataclass
class StreamResult:
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    chunks: list[dict] = field(default_factory=list)
    finish_reason: str | None = None
    done: bool = False
    error: dict | None = None
    # The gateway's `lifeline` object, per chunk that has one.
    seqs: list[int] = field(default_factory=list)
    epochs: list[int] = field(default_factory=list)
    continuations: list[str | None] = field(default_factory=list)
    arrived: list[float] = field(default_factory=list)  # time.monotonic() per chunk with `lifeline`, when read

    def move_gap(self) -> float | None:
        """Seconds between the last chunk before the first move and the first chunk after it; None if none moved."""
        moved = next((i for i, epoch in enumerate(self.epochs) if epoch > 0), None)
        return None if not moved else self.arrived[moved] - self.arrived[moved - 1]


def stream_completion(base_url: str, body: dict, *, timeout: float = 60.0, max_chunks: int | None = None,
                      path: str = "/v1/completions", headers: dict[str, str] | None = None,
                      on_token: Callable[[int], None] | None = None) -> StreamResult:
    """POST a streaming completion (or chat, by `path`) and collect it; stops early after `max_chunks`.

    `on_token(n)` is called after each chunk with the number of token ids seen so far (a test's kill trigger).
    """
    result = StreamResult()
    with httpx.Client(timeout=timeout) as client:
        with connect_sse(client, "POST", f"{base_url}{path}", json={**body, "stream": True},
                         headers=headers or {}) as source:
            source.response.raise_for_status()
            for event in source.iter_sse():
                if event.data == "[DONE]":
                    result.done = True
                    break
                chunk = json.loads(event.data)
                if "error" in chunk:
                    result.error = chunk["error"]
                    break
                result.chunks.append(chunk)
                if (lifeline := chunk.get("lifeline")) is not None:
                    result.seqs.append(lifeline["seq"])
                    result.epochs.append(lifeline.get("epoch", 0))
                    result.continuations.append(lifeline.get("continuation"))
                    result.arrived.append(time.monotonic())
                choice = chunk["choices"][0] if chunk.get("choices") else None
                if choice is not None:
                    result.token_ids += choice.get("token_ids", [])
                    result.text += choice.get("text", "")
                    result.finish_reason = choice.get("finish_reason") or result.finish_reason
                if on_token is not None:
                    on_token(len(result.token_ids))
                if max_chunks is not None and len(result.chunks) >= max_chunks:
                    break
    return result


def complete(base_url: str, body: dict, *, timeout: float = 60.0) -> httpx.Response:
    return oneshot_http.post(f"{base_url}/v1/completions", json={**body, "stream": False}, timeout=timeout)
