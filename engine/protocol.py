"""Request bodies the reference engine serves: `contract.openai` narrowed to vLLM's subset.

Field names and defaults follow vLLM so the gateway talks to this engine and
to vLLM with the same code. The engine serves one choice per request.

It implements none of the constrained-decoding fields (`logit_bias`,
`response_format`, `guided_*`, penalties), nor `echo` or a chat answer's
`logprobs` / `top_logprobs`: a request that sets one to anything but its
no-op value is refused with a 400 naming the field, never served as if the
field were absent. A completion's `logprobs` (top-N per token) is served.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from contract.openai import ChatMessage, ConstrainedDecodingFields, SamplingFields
from contract.sampling import IDENTIFY_ARG, IDENTIFY_VALUE, SAMPLER_ID
from contract.session import CHECKPOINT_PARAM, KVCheckpointAsk

_NO_OP = {name: field.default for name, field in ConstrainedDecodingFields.model_fields.items()}


class EngineSampling(SamplingFields, ConstrainedDecodingFields):
    model: str | None = None
    max_tokens: int | None = None
    n: int = Field(1, ge=1, le=1, description="the reference engine serves one choice per request")
    vllm_xargs: dict[str, Any] | None = Field(None, description="vLLM's per-request extra arguments; only the "
                                              "sampler question (contract/sampling.py) means anything here")

    @field_validator("vllm_xargs")
    @classmethod
    def _sampler_question(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """Answer as Lifeline's vLLM sampler does: this engine always samples position-keyed (engine/sampling.py)."""
        if value and value.get(IDENTIFY_ARG) == IDENTIFY_VALUE:
            raise ValueError(f"{IDENTIFY_ARG}: this engine samples with {SAMPLER_ID}")
        return value

    @field_validator(*_NO_OP)
    @classmethod
    def _not_implemented(cls, value: Any, info: ValidationInfo) -> Any:
        if value != _NO_OP[info.field_name] and not (info.field_name == "response_format" and value.type == "text"):
            raise ValueError("the reference engine does not implement constrained decoding; "
                             "serve such requests from vLLM")
        return value


class CompletionRequest(EngineSampling):
    prompt: str | list[int]
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = Field(False, description="refused when true: the answer never repeats the prompt")
    kv_transfer_params: dict[str, KVCheckpointAsk] | None = Field(
        None, description=f"vLLM's per-request KV connector field; only {CHECKPOINT_PARAM!r} means anything here: "
                          "checkpoint the prompt's full blocks (contract.session.checkpoint_completion)")

    @field_validator("kv_transfer_params")
    @classmethod
    def _only_checkpoints(cls, value: dict[str, KVCheckpointAsk] | None) -> dict[str, KVCheckpointAsk] | None:
        if value and set(value) != {CHECKPOINT_PARAM}:
            raise ValueError(f"the reference engine serves only {CHECKPOINT_PARAM!r} in kv_transfer_params")
        return value

    def checkpoint_ask(self) -> KVCheckpointAsk | None:
        return (self.kv_transfer_params or {}).get(CHECKPOINT_PARAM)

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, echo: bool) -> bool:
        if echo:
            raise ValueError("the reference engine does not echo the prompt")
        return echo


class ChatCompletionRequest(EngineSampling):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = Field(None, description="refused: the reference engine parses no tool calls")
    logprobs: bool = Field(False, description="refused when true: a chat answer carries no logprobs here")
    top_logprobs: int | None = Field(None, ge=0, le=20, description="refused: a chat answer carries no logprobs here")
    add_generation_prompt: bool = True

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        if tools:
            raise ValueError("the reference engine does not parse tool calls (as vLLM without "
                             "--enable-auto-tool-choice); send tool requests through the gateway, which renders the "
                             "tools into the prompt and parses the calls")
        return tools

    @field_validator("logprobs", "top_logprobs")
    @classmethod
    def _no_chat_logprobs(cls, value: bool | int | None) -> bool | int | None:
        if value:
            raise ValueError("the reference engine answers chat without logprobs (a completion's `logprobs` is served)")
        return value
