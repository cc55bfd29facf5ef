"""The work behind `/v1/completions` and `/v1/chat/completions`: validate, schedule, shape.

Handlers in `engine.api_router` only parse and delegate here. The serving
layer keeps the set of in-flight sequences, so a planned shutdown can wait for
them and end the rest with a typed event the gateway migrates on
(`contract.identity.DRAINING_ERROR_TYPE`).
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator

from fastapi.responses import JSONResponse, Response, StreamingResponse

from common.chat_template import render_chat
from common.logs import get_logger
from contract.openai import usage
from engine.errors import BadRequest, EngineDraining, EngineError, EngineOverloaded, NotReady
from engine.lifecycle import EngineStatus
from engine.protocol import ChatCompletionRequest, CompletionRequest, EngineSampling
from engine.response_shapes import ChatShape, CompletionShape, DecodeStream
from engine.runtime import EngineRuntime
from engine.sampling import SamplingParams
from engine.scheduler import ErrorEvent, QueueFull, Sequence, TokenEvent
from engine.sse import DONE, sse_data, sse_error

log = get_logger(__name__)

REQUEST_ID_PREFIXES = {"completion": "cmpl-", "chat": "chatcmpl-"}


def request_id_for(kind: str, caller_id: str | None) -> str:
    """vLLM's `cmpl-…`/`chatcmpl-…` id; a caller's id that already carries a prefix is kept as it is."""
    if caller_id is None:
        return REQUEST_ID_PREFIXES[kind] + uuid.uuid4().hex
    if caller_id.startswith(tuple(REQUEST_ID_PREFIXES.values())):
        return caller_id
    return REQUEST_ID_PREFIXES[kind] + caller_id


def _error_from(event: ErrorEvent) -> EngineError:
    if event.error_type == EngineDraining.error_type:
        return EngineDraining(event.message)
    return EngineError(event.message, type=event.error_type)


class OpenAIServing:
    def __init__(self, runtime: EngineRuntime) -> None:
        self.runtime = runtime
        self.in_flight: set[Sequence] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    # -- in-flight accounting (for drains) ---------------------------------------
    def _begin(self, seq: Sequence) -> None:
        self.in_flight.add(seq)
        self._idle.clear()

    def _end(self, seq: Sequence) -> None:
        self.in_flight.discard(seq)
        if not self.in_flight:
            self._idle.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()

    def end_in_flight(self, event: ErrorEvent) -> int:
        """End every in-flight request with `event` (the scheduler drops them at its next step)."""
        ended = list(self.in_flight)
        for seq in ended:
            seq.cancel()
            seq.events.put_nowait(event)
        return len(ended)

    # -- prompts ---------------------------------------------------------------
    def _encode(self, text: str, param: str) -> list[int]:
        try:
            return self.runtime.tokenizer.encode(text, add_special_tokens=False).ids
        except TypeError as exc:  # e.g. a lone surrogate, which has no UTF-8 form
            raise BadRequest(f"{param} cannot be tokenized: {exc}", param=param) from None

    def completion_prompt_ids(self, prompt: str | list[int]) -> list[int]:
        if not prompt:
            raise BadRequest("prompt must not be empty", param="prompt")
        if isinstance(prompt, str):
            return self._encode(prompt, "prompt")
        return self.checked_token_ids(prompt, "prompt")

    def checked_token_ids(self, token_ids: list[int], param: str) -> list[int]:
        """Token ids a client sent, refused (400) unless every one is in the vocabulary: an id past it would
        fail inside the model, and a negative one would index the embedding from its end."""
        vocab = self.runtime.model.shape.vocab_size
        bad = [t for t in token_ids if not 0 <= t < vocab]
        if bad:
            raise BadRequest(f"token id {bad[0]} is outside the vocabulary [0, {vocab})", param=param)
        return list(token_ids)

    def chat_prompt_ids(self, body: ChatCompletionRequest) -> list[int]:
        if self.runtime.chat_template is None:
            raise BadRequest("this model has no chat template")
        rendered = render_chat(self.runtime.chat_template, [m.template_dict() for m in body.messages],
                               add_generation_prompt=body.add_generation_prompt)
        return self._encode(rendered, "messages")

    def _max_tokens(self, body: EngineSampling, prompt_ids: list[int]) -> int:
        runtime = self.runtime
        if body.model is not None and body.model != runtime.settings.model_name:
            raise BadRequest(f"model {body.model!r} does not exist; this engine serves {runtime.settings.model_name!r}",
                             param="model")
        if runtime.status is EngineStatus.DRAINING:
            raise EngineDraining("engine is draining for a planned shutdown; not taking new requests", retry_after_s=1)
        if not runtime.ready:
            raise NotReady(f"engine is {runtime.status}; not taking new requests", retry_after_s=1)
        limit = runtime.model.shape.max_positions
        if body.max_tokens is None and len(prompt_ids) >= limit:
            raise BadRequest(f"prompt ({len(prompt_ids)} tokens) leaves no room for output in the context length {limit}",
                             param="messages" if isinstance(body, ChatCompletionRequest) else "prompt")
        max_tokens = body.max_tokens if body.max_tokens is not None else limit - len(prompt_ids)
        if max_tokens <= 0:
            raise BadRequest("max_tokens must be positive", param="max_tokens")
        if len(prompt_ids) + max_tokens > limit:
            raise BadRequest(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceeds the context length {limit}",
                param="max_tokens",
            )
        if body.stop_token_ids and any(not 0 <= t < runtime.model.shape.vocab_size for t in body.stop_token_ids):
            raise BadRequest("stop_token_ids holds an id outside the vocabulary", param="stop_token_ids")
        return max_tokens

    # -- requests --------------------------------------------------------------
    async def create_completion(self, body: CompletionRequest, caller_id: str | None) -> Response:
        return await self._serve(body, self.completion_prompt_ids(body.prompt), kind="completion", caller_id=caller_id)

    async def create_chat_completion(self, body: ChatCompletionRequest, caller_id: str | None) -> Response:
        return await self._serve(body, self.chat_prompt_ids(body), kind="chat", caller_id=caller_id)

    async def _serve(self, body: EngineSampling, prompt_ids: list[int], *, kind: str, caller_id: str | None) -> Response:
        runtime = self.runtime
        max_tokens = self._max_tokens(body, prompt_ids)
        runtime.faults.admit_request()
        request_id = request_id_for(kind, caller_id)
        stop_ids = set(body.stop_token_ids or [])
        if not body.ignore_eos:
            stop_ids.add(runtime.model.shape.eos_token_id)
        logprobs = body.logprobs if isinstance(body, CompletionRequest) else None  # chat refuses them (protocol.py)
        seq = Sequence(
            request_id=request_id, prompt_ids=prompt_ids, max_tokens=max_tokens,
            sampling=SamplingParams(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, seed=body.seed),
            seed=body.seed if body.seed is not None else random.getrandbits(63),
            stop_token_ids=frozenset(stop_ids), logprobs=logprobs, loop=asyncio.get_running_loop(),
        )
        log.info("request accepted", request_id=request_id, prompt_tokens=len(prompt_ids), max_tokens=max_tokens,
                 stream=body.stream)
        shape_type = ChatShape if kind == "chat" else CompletionShape
        shape = shape_type(runtime.tokenizer, runtime.settings.model_name, request_id, body, int(runtime.clock.wall()))
        if runtime.checkpointer is not None:
            prefetched = await asyncio.to_thread(runtime.checkpointer.prefetch, prompt_ids, request_id)
            seq.kv_cached_before = prefetched.cached_blocks * runtime.checkpointer.block_tokens
            seq.kv_imported_upto = prefetched.upto_blocks * runtime.checkpointer.block_tokens
        self._begin(seq)
        try:
            runtime.scheduler.submit(seq)
        except QueueFull as full:
            self._end(seq)
            runtime.metrics.refused_overloaded.inc()
            raise EngineOverloaded(f"{full}; try again later", retry_after_s=1) from None
        if body.stream:
            return StreamingResponse(self._stream(seq, body, prompt_ids, shape), media_type="text/event-stream")
        return await self._collect(seq, body, prompt_ids, shape)

    async def prefill(self, prompt_ids: list[int], request_id: str) -> int:
        """Compute the KV of `prompt_ids` into the prefix cache (one greedy token, discarded); positions restored.

        For a session checkpoint whose context the prefix cache lacks in part (the client re-sent an answer
        that tokenizes differently from what was generated). Counted in-flight, so a drain waits for it.
        """
        runtime = self.runtime
        if not runtime.ready:
            raise NotReady(f"engine is {runtime.status}; not computing KV", retry_after_s=1)
        seq = Sequence(request_id=request_id, prompt_ids=prompt_ids, max_tokens=1,
                       sampling=SamplingParams(temperature=0.0, top_p=1.0, top_k=-1, seed=0), seed=0,
                       stop_token_ids=frozenset(), logprobs=None, loop=asyncio.get_running_loop())
        self._begin(seq)
        try:
            try:
                runtime.scheduler.submit(seq)
            except QueueFull as full:
                raise EngineOverloaded(f"{full}; not computing KV now", retry_after_s=1) from None
            while True:
                event = await seq.events.get()
                if isinstance(event, ErrorEvent):
                    raise _error_from(event)
                if event.finish_reason is not None:
                    return seq.kv_restored
        finally:
            seq.cancel()
            self._end(seq)

    async def _stream(self, seq: Sequence, body: EngineSampling, prompt_ids: list[int],
                      shape: CompletionShape) -> AsyncIterator[str]:
        hooks = self.runtime.faults
        decode = DecodeStream(self.runtime.tokenizer, seq, body.stop_strings())
        first = True
        continuous = body.continuous_usage()
        try:
            if (opening := shape.opening_chunk()) is not None:
                if body.return_token_ids:
                    opening["prompt_token_ids"] = prompt_ids
                yield sse_data(opening)
                first = False
            while True:
                event = await seq.events.get()
                if isinstance(event, ErrorEvent):
                    yield sse_error(event.error_type, event.message, code=event.code)
                    log.info("request ended with an error event", request_id=seq.request_id, error_type=event.error_type,
                             tokens=len(seq.output_ids))
                    return
                await hooks.before_send()
                text = decode.accept(event)
                chunk = shape.chunk(shape.chunk_choice(text, event, decode.finish_reason))
                if continuous:
                    chunk["usage"] = usage(len(prompt_ids), len(seq.output_ids), cached_tokens=seq.kv_restored)
                if first and body.return_token_ids:
                    chunk["prompt_token_ids"] = prompt_ids
                    chunk["choices"][0]["prompt_token_ids"] = prompt_ids
                first = False
                yield sse_data(chunk)
                hooks.after_send(1)
                if decode.finish_reason is not None:
                    break
            if body.include_usage():
                yield sse_data(shape.usage_chunk(prompt_ids, seq.output_ids, cached_tokens=seq.kv_restored))
            yield DONE
            log.info("request finished", request_id=seq.request_id, tokens=len(seq.output_ids),
                     finish_reason=decode.finish_reason)
        finally:
            seq.cancel()  # no-op if finished; stops decoding if the client went away
            self._end(seq)

    async def _collect(self, seq: Sequence, body: EngineSampling, prompt_ids: list[int],
                       shape: CompletionShape) -> JSONResponse:
        hooks = self.runtime.faults
        decode = DecodeStream(self.runtime.tokenizer, seq, body.stop_strings())
        events: list[TokenEvent] = []
        try:
            while decode.finish_reason is None:
                event = await seq.events.get()
                if isinstance(event, ErrorEvent):
                    raise _error_from(event)
                await hooks.before_send()
                decode.accept(event)
                events.append(event)
                hooks.after_send(1)
        finally:
            seq.cancel()
            self._end(seq)
        log.info("request finished", request_id=seq.request_id, tokens=len(events), finish_reason=decode.finish_reason)
        return JSONResponse(shape.full_body(decode.text, events, decode.finish_reason, prompt_ids,
                                            cached_tokens=seq.kv_restored))
