"""Request bodies the reference engine serves: `contract.openai` narrowed to vLLM's subset.

Field names and defaults follow vLLM so the gateway talks to this engine and
to vLLM with the same code. The engine serves one choice per request.
"""

from __future__ import annotations

from pydantic import Field

from contract.openai import ChatMessage, SamplingFields


class EngineSampling(SamplingFields):
    model: str | None = None
    max_tokens: int | None = None
    n: int = Field(1, ge=1, le=1, description="the reference engine serves one choice per request")


class CompletionRequest(EngineSampling):
    prompt: str | list[int]
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False


class ChatCompletionRequest(EngineSampling):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    add_generation_prompt: bool = True
