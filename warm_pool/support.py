"""Is this engine one Lifeline can recover streams from? Checked once, before its first lease.

The gateway resumes a stream from its committed prefix, which is a list of
token ids: every streamed `/v1/completions` chunk must carry the ids of its
tokens (`return_token_ids: true` → `choices[].token_ids`). vLLM streams them
from 0.10.2 on; an older vLLM (or another OpenAI-compatible server) ignores the
flag and sends text alone, and a gateway routing to it would re-send text it
cannot line up with the prefix. Such an engine is refused, never leased, with
a typed error that names what is missing and the minimum version — not served
in a degraded, silent mode.

    agent: first lease of an instance ──► check_token_ids(url, model) ──► ok: lease
                                                                    └──► UnsupportedEngine: no lease, ever
                                                                         (the instance's reason, an event, a log)
"""

from __future__ import annotations

import json

import httpx
from httpx_sse import SSEError, aconnect_sse

from common.errors import LifelineError
from contract.engine_support import MIN_VLLM_VERSION
from contract.sampling import Sampling, identify_request, sampling_from_answer
CHECK_PROMPT = [1, 2, 3, 4]  # ids every vocabulary has


class UnsupportedEngine(LifelineError):
    """The engine answers, but not what stream recovery needs: it is never leased."""

    status_code = 422
    error_type = "unsupported_engine"


class SupportUnknown(Exception):
    """The check got no answer it can judge (unreachable, a timeout, a 5xx): ask again before the next lease."""


async def check_token_ids(client: httpx.AsyncClient, url: str, *, model: str,
                          timeout: httpx.Timeout | None = None) -> None:
    """A streamed two-token completion whose every chunk must carry `token_ids`; UnsupportedEngine if not."""
    body = {"model": model, "prompt": CHECK_PROMPT, "max_tokens": 2, "temperature": 0.0, "ignore_eos": True,
            "return_token_ids": True, "stream": True}
    chunks = 0
    try:
        async with aconnect_sse(client, "POST", f"{url}/v1/completions", json=body,
                                **({"timeout": timeout} if timeout is not None else {})) as source:
            if source.response.status_code >= 500 or source.response.status_code in (408, 429):
                raise SupportUnknown(f"/v1/completions answered {source.response.status_code}")
            if not source.response.is_success:
                await source.response.aread()
                raise UnsupportedEngine(
                    f"{url}: a streamed /v1/completions with token-id prompts and return_token_ids was refused "
                    f"({source.response.status_code}: {source.response.text[:200]}); Lifeline needs vLLM "
                    f">= {MIN_VLLM_VERSION}")
            async for event in source.aiter_sse():
                if event.data == "[DONE]":
                    break
                chunk = json.loads(event.data)
                for choice in chunk.get("choices") or []:
                    if not choice.get("text") and not choice.get("token_ids") and choice.get("finish_reason"):
                        continue  # a finish-only chunk carries no token
                    chunks += 1
                    ids = choice.get("token_ids")
                    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
                        raise UnsupportedEngine(
                            f"{url}: its streamed /v1/completions chunks carry no per-token ids "
                            f"(choices[].token_ids with return_token_ids: true), which stream recovery needs; "
                            f"vLLM streams them from {MIN_VLLM_VERSION} on: upgrade the engine to vLLM >= "
                            f"{MIN_VLLM_VERSION}")
    except SSEError as exc:  # it answered 2xx, but not with a stream
        raise UnsupportedEngine(f"{url}: a streamed /v1/completions was not answered with a stream ({exc}); "
                                f"Lifeline needs vLLM >= {MIN_VLLM_VERSION}") from None
    except httpx.TransportError as exc:
        raise SupportUnknown(f"{type(exc).__name__}: {str(exc)[:200]}") from None
    except (json.JSONDecodeError, TypeError, AttributeError) as exc:
        raise UnsupportedEngine(f"{url}: its streamed /v1/completions is not OpenAI's stream format "
                                f"({str(exc)[:200]}); Lifeline needs vLLM >= {MIN_VLLM_VERSION}") from None
    if chunks == 0:
        raise UnsupportedEngine(f"{url}: a streamed /v1/completions with max_tokens 2 and ignore_eos sent no token "
                                f"chunk; Lifeline needs vLLM >= {MIN_VLLM_VERSION}")


async def ask_sampling(client: httpx.AsyncClient, url: str, *, model: str,
                       timeout: httpx.Timeout | None = None) -> Sampling:
    """Whether the engine samples seeded requests position-keyed (Lifeline's sampler in vLLM): one request, no decode.

    A 5xx or no answer is SupportUnknown (asked again before the next lease), never a guess of identity.
    """
    try:
        response = await client.post(f"{url}/v1/completions", json=identify_request(model),
                                     **({"timeout": timeout} if timeout is not None else {}))
    except httpx.TransportError as exc:
        raise SupportUnknown(f"{type(exc).__name__}: {str(exc)[:200]}") from None
    if response.status_code >= 500 or response.status_code in (408, 429):
        raise SupportUnknown(f"the sampler question was answered {response.status_code}")
    return sampling_from_answer(response.status_code, response.text)
