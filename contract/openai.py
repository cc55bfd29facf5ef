"""The OpenAI-compatible request surface the gateway and the engines speak (vLLM's names).

One definition of the fields both sides read, and of the small response
pieces both build (usage, model cards, the non-streamed response bodies), so
a field added for one side cannot drift from the other. Each side narrows it
in its own protocol module: the gateway (`gateway/schemas.py`) requires
`model` and accepts `n` > 1 and `user`; the reference engine
(`engine/protocol.py`) serves one choice and vLLM's extras (`echo`,
`add_generation_prompt`). Unknown fields are ignored, as vLLM does, unless a
side refuses them by name.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields of both endpoints that decide which tokens come out."""

    model_config = ConfigDict(extra="ignore")

    temperature: float = Field(1.0, ge=0.0, le=100.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = -1
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]]

    def text(self) -> str:
        """The message's text; content parts other than text carry none."""
        if isinstance(self.content, str):
            return self.content
        return "".join(str(part.get("text", "")) for part in self.content if part.get("type") == "text")


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def model_card(model_id: str, *, root: str, max_model_len: int, owned_by: str) -> dict[str, Any]:
    """One entry of `GET /v1/models`, as vLLM lists it."""
    return {"id": model_id, "object": "model", "created": 0, "owned_by": owned_by, "root": root,
            "max_model_len": max_model_len}


def model_list(cards: list[dict[str, Any]]) -> dict[str, Any]:
    return {"object": "list", "data": cards}


def completion_body(*, kind: Literal["chat", "completion"], request_id: str, created: int, model: str, text: str,
                    finish_reason: str | None, token_ids: list[int] | None, usage_: dict[str, int] | None) -> dict[str, Any]:
    """A non-streamed response: `chat.completion` or `text_completion` with one choice."""
    choice: dict[str, Any]
    if kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return {"id": request_id, "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": created, "model": model, "choices": [choice], "usage": usage_}
