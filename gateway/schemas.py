"""Request bodies the gateway accepts: `contract.openai` narrowed for the gateway.

The gateway requires `model` (an alias or a version), accepts
`max_completion_tokens` and `user` (the consistent-hashing key), and refuses
`n` > 1 and `best_of` > 1 with a 400 naming the field: every candidate would
need its own committed token log to be resumed, and the gateway keeps one per
stream (NVIDIA Dynamo refuses n > 1 for the same reason). `n` and `best_of`
of 1 ask for nothing and are accepted.

Nothing is stripped silently. Constrained decoding (`logit_bias`,
`response_format`, vLLM's `guided_*`, penalties) is forwarded to the engine;
all but `logit_bias` keep engine state along the output, so such a stream is
not resumed after its first committed token (`not_resumable`). Any other
field is refused with a 400 naming it, except the few that change nothing
(`NO_OP_FIELDS`).

Tool calling (chat): `tools` and the history's `tool_calls`, `tool_call_id`
and `name` are rendered into the prompt by the model's chat template (a
template that does not render them is refused, never silently left out),
and the answer's tool calls are parsed by the gateway (`gateway/tool_calls.py`),
so such a stream stays resumable like any other. `tool_choice` `auto` (the
default with tools) and `none` are served; `required` and a named function
are refused: forcing a call takes a grammar in the engine, which a
continuation after a failure could not resume. `parallel_tool_calls: false`
keeps an answer to its first call, as vLLM does. The legacy `functions` /
`function_call` are refused, naming `tools`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from contract.openai import TOOL_FIELDS, ChatMessage, ConstrainedDecodingFields, SamplingFields, ToolDefinition
from contract.sampling import Sampling


NO_OP_FIELDS = frozenset({"metadata", "store", "service_tier"})  # accepted, change nothing
_ABSENT = (None, "none", "", [], {})  # a tool field with one of these values asks for nothing


class GatewaySampling(SamplingFields, ConstrainedDecodingFields):
    model_config = ConfigDict(extra="allow")  # kept to be refused by name (`refused_field`), never dropped

    model: str
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1, description="refused above 1 (`refused_field`)")
    best_of: int | None = Field(None, ge=1, description="refused above 1 (`refused_field`)")
    user: str | None = None

    def token_budget(self) -> int | None:
        return self.max_tokens if self.max_tokens is not None else self.max_completion_tokens

    @field_validator("logit_bias")
    @classmethod
    def _bias_by_token_id(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for token, value in (bias or {}).items():
            if not token.isdigit():
                raise ValueError(f"logit_bias keys are token ids, not {token!r}")
            if not -100.0 <= value <= 100.0:
                raise ValueError(f"logit_bias[{token}] must be in [-100, 100]")
        return bias

    def refused_field(self) -> tuple[str, str] | None:
        """The first field the gateway cannot forward, and why; None if every field can go to the engine."""
        for name in ("n", "best_of"):
            if (getattr(self, name) or 1) > 1:
                return name, (f"{name} > 1 is not supported through the gateway: each candidate would need its own "
                              "committed token log to continue after an engine failure, and a stream keeps one "
                              "(NVIDIA Dynamo refuses it too); send one request per candidate instead")
        for name, value in (self.model_extra or {}).items():
            if name in NO_OP_FIELDS or (name in TOOL_FIELDS and value in _ABSENT):
                continue
            if name in ("functions", "function_call"):
                return name, f"{name}: the legacy function-calling fields are not served; send `tools` instead"
            if name in TOOL_FIELDS:
                return name, f"{name}: tool calling is a chat feature; send it to /v1/chat/completions"
            return name, f"{name}: not supported through the gateway"
        return None

    def engine_fields(self) -> dict[str, Any]:
        """The sampling fields forwarded to the engine as they are (the gateway sets `seed`, prompt and budget)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "stop_token_ids": self.stop_token_ids, "ignore_eos": self.ignore_eos,
                **self.constraint_fields()}

    def stateful(self) -> bool:
        """Whether the engine keeps state for this request that the committed tokens cannot rebuild."""
        return self.keeps_output_state()


class CompletionRequest(GatewaySampling):
    prompt: str | list[int]
    logprobs: int | None = Field(None, description="refused: not supported through the gateway")
    echo: bool = Field(False, description="refused: not supported through the gateway")

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, logprobs: int | None) -> int | None:
        if logprobs is not None:
            raise ValueError("logprobs are not supported by the gateway")
        return logprobs

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, echo: bool) -> bool:
        if echo:
            raise ValueError("echo is not supported by the gateway")
        return echo


class ChatCompletionRequest(GatewaySampling):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolDefinition] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = Field(None, description="false: the answer carries its first call only")

    def tool_calling(self) -> bool:
        """Whether the tools are offered to the model (and its answer parsed for calls)."""
        return bool(self.tools) and self.tool_choice != "none"

    def offered_tools(self) -> list[dict[str, Any]] | None:
        """The tools as the chat template renders them; None when none are offered."""
        return [t.model_dump(exclude_none=True) for t in self.tools or []] if self.tool_calling() else None

    def refused_field(self) -> tuple[str, str] | None:
        if self.tool_choice is not None and self.tool_choice not in ("none", "auto"):
            return "tool_choice", (f"tool_choice {self.tool_choice!r}: the gateway serves 'auto' and 'none'; "
                                   "forcing a call takes a grammar in the engine, which a continuation after an "
                                   "engine failure could not resume")
        if self.tool_choice is not None and not self.tools and self.tool_choice != "none":
            return "tool_choice", "tool_choice: set without any tools"
        return super().refused_field()
    logprobs: bool = Field(False, description="refused when true: not supported through the gateway")
    top_logprobs: int | None = Field(None, description="refused: not supported through the gateway")

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, logprobs: bool) -> bool:
        if logprobs:
            raise ValueError("logprobs are not supported by the gateway")
        return logprobs

    @field_validator("top_logprobs")
    @classmethod
    def _no_top_logprobs(cls, top_logprobs: int | None) -> int | None:
        if top_logprobs is not None:
            raise ValueError("top_logprobs are not supported by the gateway")
        return top_logprobs


class LeaseRegistration(BaseModel):
    model_config = ConfigDict(extra="forbid")

    instance_id: str = Field(min_length=1, max_length=200)
    url: str = Field(pattern=r"^https?://")
    version: str = Field(min_length=1)
    zone: str = "local-a"
    region: str = "local"
    sampling: Sampling = Sampling.ENGINE_DEFAULT  # contract/sampling.py: may a seeded stream move here exactly?


class LeaseRenewal(BaseModel):
    model_config = ConfigDict(extra="forbid")

    generation: int = Field(ge=1)
