"""Request bodies the gateway accepts: `contract.openai` narrowed for the gateway.

The gateway requires `model` (an alias or a version), accepts `n` > 1 (not
resumable), `max_completion_tokens` and `user` (the consistent-hashing key).
"""

from __future__ import annotations

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


class CompletionRequest(GatewaySampling):
    prompt: str | list[int]
    logprobs: int | None = Field(None, ge=0, le=0, description="not supported through the gateway yet")
    echo: bool = Field(False, description="not supported")

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, echo: bool) -> bool:
        if echo:
            raise ValueError("echo is not supported by the gateway")
        return echo


class ChatCompletionRequest(GatewaySampling):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = Field(False, description="not supported through the gateway yet")


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
