"""Request body → prompt token ids: size limit, text checks, chat template, tokenization off the loop.

A gateway replica serves every stream on one event loop, so nothing here may
hold it long: bodies are read up to `max_body_bytes` (413 beyond), and prompts
longer than `tokenize_in_thread_chars` are rendered and tokenized in a worker
thread, so a large prompt does not stall the streams, health checks and lease
renewals that share the loop. The thread calls `encode_batch`, which releases
the GIL while it encodes; plain `encode` holds it (measured on a 5 MB prompt:
the loop stalled 4.3 s with `encode` in a thread, 0.28 s with `encode_batch`,
the rest being the conversion of the ids to a Python list).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import Request

from common.chat_template import render_chat, renders_tools
from common.request_body import Body, parse_json_body
from gateway.errors import BadRequest, PayloadTooLarge
from gateway.routing_table import ModelVersion
from gateway.schemas import ChatCompletionRequest, CompletionRequest


async def read_body(request: Request, model: type[Body], *, max_bytes: int) -> Body:
    """The request's JSON body as `model`; 413 over `max_bytes`, 400 for anything malformed."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"the request body is {declared} bytes; the limit is {max_bytes}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"the request body is over the limit of {max_bytes} bytes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        body = parse_json_body(raw, model, BadRequest)
    except RecursionError:
        raise BadRequest("request body is nested too deeply") from None
    if b"\\ud" in raw or b"\\uD" in raw:  # only a \u escape can carry a lone surrogate into a str
        _refuse_lone_surrogates(json.loads(raw))
    return body


def _refuse_lone_surrogates(payload: Any) -> None:
    """400 naming the first string that is not valid Unicode (a lone UTF-16 surrogate)."""
    stack: list[tuple[str, Any]] = [("", payload)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise BadRequest(f"{path or 'body'}: holds a lone surrogate, which is not valid Unicode text",
                                 param=path or None) from None
        elif isinstance(value, dict):
            stack.extend((f"{path}.{k}" if path else str(k), v) for k, v in value.items() if isinstance(v, (str, dict, list)))
            for key in value:
                stack.append((path or "body", key))
        elif isinstance(value, list):
            stack.extend((f"{path}.{i}", v) for i, v in enumerate(value) if isinstance(v, (str, dict, list)))


async def completion_prompt(body: CompletionRequest, version: ModelVersion, *, thread_above: int) -> list[int]:
    if not body.prompt:
        raise BadRequest("prompt must not be empty", param="prompt")
    if isinstance(body.prompt, str):
        return await _encode(version, body.prompt, thread_above)
    vocab = version.tokenizer.get_vocab_size()
    if any(not 0 <= t < vocab for t in body.prompt):
        raise BadRequest(f"prompt holds a token id outside the vocabulary [0, {vocab})", param="prompt")
    return list(body.prompt)


async def chat_prompt(body: ChatCompletionRequest, version: ModelVersion, *, thread_above: int) -> list[int]:
    template = version.chat_template
    if template is None:
        raise BadRequest(f"model {body.model!r} has no chat template", param="model")
    messages = [m.template_dict() for m in body.messages]
    tools = body.offered_tools()
    _check_renders_tools(body, version.version, template, tools)
    if sum(len(m["content"]) for m in messages) <= thread_above:
        return await _encode(version, _render(template, messages, tools), thread_above)
    return await asyncio.to_thread(lambda: _encode_released(version, _render(template, messages, tools)))


def _check_renders_tools(body: ChatCompletionRequest, version: str, template: str,
                         tools: list[dict[str, Any]] | None) -> None:
    """A 400 for tool fields the model's chat template would leave out of the prompt without a word."""
    if tools and not renders_tools(template):
        raise BadRequest(f"tools: the chat template of {version} does not render tools, so the model would never "
                         "see them", param="tools")
    used = next((i for i, m in enumerate(body.messages) if m.uses_tools()), None)
    if used is not None and "tool_call" not in template:
        raise BadRequest(f"messages.{used}: the chat template of {version} does not render tool calls or tool "
                         "results, so the model would not see this message as sent", param=f"messages.{used}")


def _render(template: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
    return render_chat(template, messages, tools=tools)


async def _encode(version: ModelVersion, text: str, thread_above: int) -> list[int]:
    if len(text) <= thread_above:
        return _encode_now(version, text)
    return await asyncio.to_thread(_encode_released, version, text)


def _encode_now(version: ModelVersion, text: str) -> list[int]:
    return version.tokenizer.encode(text, add_special_tokens=False).ids


def _encode_released(version: ModelVersion, text: str) -> list[int]:
    """Encode without holding the GIL (in a worker thread): `encode_batch` releases it, `encode` does not."""
    return version.tokenizer.encode_batch([text], add_special_tokens=False)[0].ids
