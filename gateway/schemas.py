"""Request bodies the gateway accepts: `contract.openai` narrowed for the gateway.

The gateway requires `model` (an alias or a version), accepts `n` > 1 (not
resumable), `max_completion_tokens` and `user` (the consistent-hashing key).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from contract.openai import ChatMessage, SamplingFields


class GatewaySampling(SamplingFields):
    model: str
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1, le=16)
    user: str | None = None

    def token_budget(self) -> int | None:
        return self.max_tokens if self.max_tokens is not None else self.max_completion_tokens

    def engine_fields(self) -> dict[str, Any]:
        """The sampling fields forwarded to the engine as they are (the gateway sets `seed`, prompt and budget)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "stop_token_ids": self.stop_token_ids, "ignore_eos": self.ignore_eos, "n": self.n}

    def stateful(self) -> bool:
        """Whether the engine keeps state for this request that the committed tokens cannot rebuild."""
        return False


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


class LeaseRenewal(BaseModel):
    model_config = ConfigDict(extra="forbid")

    generation: int = Field(ge=1)
