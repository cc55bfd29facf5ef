"""The OpenAI-compatible request surface the gateway and the engines speak (vLLM's names).

One definition of the fields both sides read, and of the small response
pieces both build (usage, model cards, the non-streamed response bodies), so
a field added for one side cannot drift from the other. Each side narrows it
in its own protocol module: the gateway (`gateway/schemas.py`) requires
`model` and accepts `n` > 1 and `user`; the reference engine
(`engine/protocol.py`) serves one choice and vLLM's `add_generation_prompt`,
and refuses by name what it would otherwise leave out of its answer (`echo`,
a chat answer's `logprobs`). Unknown fields are ignored, as vLLM does, unless
a side refuses them by name.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class StreamOptions(BaseModel):
    include_usage: bool = False
    # vLLM: usage on every chunk too, so a client learns `prompt_tokens_details.cached_tokens` at the first one
    continuous_usage_stats: bool = False


class SamplingFields(BaseModel):
    """Fields of both endpoints that decide which tokens come out."""

    model_config = ConfigDict(extra="ignore")

    temperature: float = Field(1.0, ge=0.0, le=100.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1, description="-1 or 0: no top-k (vLLM's values)")
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

    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage
                    and self.stream_options.continuous_usage_stats)


class ResponseFormat(BaseModel):
    """OpenAI's `response_format`: `text` (no constraint), `json_object`, or `json_schema` with its schema."""

    model_config = ConfigDict(extra="allow")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class ConstrainedDecodingFields(BaseModel):
    """Fields that constrain which tokens may come next (vLLM's names; vLLM serves them on /v1/completions).

    `logit_bias` is the same at every position. The others make the engine keep
    state along the output (a grammar's position, penalties counted over the
    generated tokens): a continuation from `prompt ‖ committed tokens` would
    restart that state, so a side that continues streams must not resume them.
    """

    logit_bias: dict[str, float] | None = None  # token id (as a string, OpenAI's form) → bias in [-100, 100]
    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0)

    def constraint_fields(self) -> dict[str, Any]:
        """The fields set to something other than their no-op default, as the engine takes them."""
        set_fields = self.model_dump(include=set(ConstrainedDecodingFields.model_fields), exclude_defaults=True,
                                     exclude_none=True)
        if self.response_format is not None and self.response_format.type == "text":
            set_fields.pop("response_format", None)
        return set_fields

    def keeps_output_state(self) -> bool:
        """Whether the engine's state for this request depends on the tokens generated so far."""
        return bool(set(self.constraint_fields()) - {"logit_bias"})


TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls", "functions", "function_call")  # OpenAI's tool calling (chat)
# Fields OpenAI's own responses put on an assistant message, which clients send back in their history as they
# got them: accepted while they carry nothing (null, empty), refused by name otherwise.
_ECHOED_EMPTY = frozenset({"refusal", "audio", "annotations", "function_call"})


class FunctionCall(BaseModel):
    """What a tool call asks for: `arguments` is a JSON object encoded as a string (OpenAI's form)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=256)
    arguments: str = Field(max_length=1_000_000)

    def arguments_object(self) -> dict[str, Any]:
        """The arguments decoded, as a chat template renders them; ValueError when they are not a JSON object."""
        decoded = json.loads(self.arguments)
        if not isinstance(decoded, dict):
            raise ValueError("a tool call's arguments must be a JSON object")
        return decoded


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(BaseModel):
    """One entry of a chat request's `tools`: a function the model may call."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionDefinition


class ChatMessage(BaseModel):
    """One message of a chat history, tool calls and tool results included; nothing in it is dropped unread."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = Field(None, max_length=256)
    tool_calls: list[ToolCall] | None = None  # assistant: the calls it made
    tool_call_id: str | None = Field(None, max_length=256)  # tool: which call this answers

    @model_validator(mode="before")
    @classmethod
    def _echoed_fields(cls, raw: Any) -> Any:
        if isinstance(raw, dict) and _ECHOED_EMPTY & raw.keys():
            raw = {k: v for k, v in raw.items() if not (k in _ECHOED_EMPTY and v in (None, "", [], {}))}
        return raw

    @model_validator(mode="after")
    def _shape(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"tool_calls: only an assistant message makes tool calls, not a {self.role} one")
        if self.tool_call_id is not None and self.role != "tool":
            raise ValueError("tool_call_id: only a tool message answers a tool call")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("tool_call_id: a tool message names the call it answers")
        if self.content is None and not self.tool_calls:
            raise ValueError("content: required, unless an assistant message makes tool calls")
        for call in self.tool_calls or []:
            call.function.arguments_object()
        return self

    def text(self) -> str:
        """The message's text; content parts other than text carry none."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(str(part.get("text", "")) for part in self.content if part.get("type") == "text")

    def template_dict(self) -> dict[str, Any]:
        """The message as a chat template reads it: role and text, plus the tool fields it carries (a call's
        arguments decoded, as Hermes/Qwen-style templates render them)."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": c.type, "function": {
                "name": c.function.name, "arguments": c.function.arguments_object()}} for c in self.tool_calls]
        return out

    def uses_tools(self) -> bool:
        return bool(self.tool_calls) or self.role == "tool"


def usage(prompt_tokens: int, completion_tokens: int, *, cached_tokens: int | None = None) -> dict[str, Any]:
    """OpenAI's usage object; `cached_tokens`, where known, as `prompt_tokens_details` (vLLM's name): prompt
    positions the engine restored (prefix cache, imported checkpoint) instead of prefilling."""
    body: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                            "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        body["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return body


def model_card(model_id: str, *, root: str, max_model_len: int, owned_by: str) -> dict[str, Any]:
    """One entry of `GET /v1/models`, as vLLM lists it."""
    return {"id": model_id, "object": "model", "created": 0, "owned_by": owned_by, "root": root,
            "max_model_len": max_model_len}


def model_list(cards: list[dict[str, Any]]) -> dict[str, Any]:
    return {"object": "list", "data": cards}


def completion_body(*, kind: Literal["chat", "completion"], request_id: str, created: int, model: str, text: str,
                    finish_reason: str | None, token_ids: list[int] | None, usage_: dict[str, Any] | None,
                    tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A non-streamed response: `chat.completion` or `text_completion` with one choice; a chat answer that called
    tools carries them (`content` null when they are all it said, as OpenAI answers)."""
    choice: dict[str, Any]
    if kind == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": text or (None if tool_calls else "")}
        if tool_calls:
            message["tool_calls"] = tool_calls
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return {"id": request_id, "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": created, "model": model, "choices": [choice], "usage": usage_}
