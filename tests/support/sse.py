"""Reading an engine's or gateway's SSE stream in tests, with httpx-sse."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import httpx
from httpx_sse import connect_sse


@dataclass
class StreamResult:
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    chunks: list[dict] = field(default_factory=list)
    finish_reason: str | None = None
    done: bool = False
    error: dict | None = None


def stream_completion(base_url: str, body: dict, *, timeout: float = 60.0, max_chunks: int | None = None) -> StreamResult:
    """POST a streaming completion and collect it; stops early after `max_chunks`."""
    result = StreamResult()
    with httpx.Client(timeout=timeout) as client:
        with connect_sse(client, "POST", f"{base_url}/v1/completions", json={**body, "stream": True}) as source:
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
                choice = chunk["choices"][0] if chunk.get("choices") else None
                if choice is not None:
                    result.token_ids += choice.get("token_ids", [])
                    result.text += choice.get("text", "")
                    result.finish_reason = choice.get("finish_reason") or result.finish_reason
                if max_chunks is not None and len(result.chunks) >= max_chunks:
                    break
    return result


def complete(base_url: str, body: dict, *, timeout: float = 60.0) -> httpx.Response:
    return httpx.post(f"{base_url}/v1/completions", json={**body, "stream": False}, timeout=timeout)
