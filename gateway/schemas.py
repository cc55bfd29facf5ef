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
field is refused with a 400 naming it — tool calling among them: the gateway
renders the chat template itself and speaks `/v1/completions` to engines, so
it cannot parse tool calls — except the few that change nothing
(`NO_OP_FIELDS`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from contract.openai import TOOL_FIELDS, ChatMessage, ConstrainedDecodingFields, SamplingFields
from contract.sampling import Sampling


NO_OP_FIELDS = frozenset({"metadata", "store", "service_tier", "parallel_tool_calls"})  # accepted, change nothing
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
            if name in TOOL_FIELDS:
                return name, (f"{name}: tool calling is not supported through the gateway (it renders the chat "
                              "template itself and cannot parse tool calls)")
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
