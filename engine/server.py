"""The engine's HTTP server: vLLM's OpenAI-compatible subset plus health.

Endpoints: POST /v1/completions, POST /v1/chat/completions, GET /v1/models,
GET /health, GET /metrics, GET /healthz/{live,ready,generation}, and with
`--enable-fault-admin` GET/POST /admin/faults.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import structlog
import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from jinja2.sandbox import ImmutableSandboxedEnvironment
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from tokenizers import Tokenizer

from engine.boot_generation import next_boot_generation
from engine.errors import BadRequest, EngineError, InjectedFailure, NotReady
from engine.faults import FaultInjector
from engine.lease_client import LeaseClient, transport_for
from engine.metrics import EngineMetrics
from engine.model import LlamaModel
from engine.protocol import ChatCompletionRequest, CompletionRequest, EngineSampling
from engine.sampling import SamplingParams
from engine.scheduler import ErrorEvent, Scheduler, Sequence, TokenEvent
from engine.settings import EngineSettings, FaultSettings
from common.detokenize import TextAssembler
from common.request_body import Body, parse_json_body
from common.logs import get_logger

log = get_logger(__name__)

SELF_TEST_PROMPT = "Healthy engine serves the request."


def weights_fingerprint(model_dir: Path) -> str:
    """sha256 over every shard's sha256, so any changed byte changes it."""
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    outer = hashlib.sha256()
    for filename in sorted(set(index["weight_map"].values())):
        inner = hashlib.sha256()
        with open(model_dir / filename, "rb") as shard:
            while block := shard.read(8 << 20):
                inner.update(block)
        outer.update(f"{filename}:{inner.hexdigest()}\n".encode())
    return "sha256:" + outer.hexdigest()


@dataclass
class EngineState:
    """Everything the request handlers share; built once in the lifespan."""

    settings: EngineSettings
    tokenizer: Tokenizer
    model: LlamaModel
    scheduler: Scheduler
    metrics: EngineMetrics
    faults: FaultInjector
    chat_template: str | None
    boot_generation: int
    weights_fingerprint: str
    started_at: float
    ready: bool = False
    # The lease registry's generation supersedes the boot counter once registered.
    lease_generation: int | None = None

    @property
    def generation(self) -> int:
        return self.lease_generation if self.lease_generation is not None else self.boot_generation


def _load_chat_template(model_dir: Path) -> str | None:
    path = model_dir / "tokenizer_config.json"
    if not path.exists():
        return None
    return json.loads(path.read_text()).get("chat_template")


def _sse(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


class _Generation:
    """One request's path from token events to text, with stop strings applied."""

    def __init__(self, state: EngineState, seq: Sequence, stops: list[str]) -> None:
        self.seq = seq
        self.assembler = TextAssembler(state.tokenizer, stops)
        self.finish_reason: str | None = None

    @property
    def text(self) -> str:
        return self.assembler.text

    def accept(self, event: TokenEvent) -> str:
        """Add a token; return the text now safe to send."""
        delta, stop_hit = self.assembler.push(event.token_id, final=event.finish_reason is not None)
        self.finish_reason = event.finish_reason
        if stop_hit:
            self.finish_reason = "stop"
            self.seq.cancel()
        return delta


def create_app(settings: EngineSettings, fault_settings: FaultSettings | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.torch_threads:
            torch.set_num_threads(settings.torch_threads)
        generation = next_boot_generation(settings.resolved_state_dir())
        structlog.contextvars.bind_contextvars(instance=settings.instance_id, generation=generation)
        log.info("engine starting", model=str(settings.model), dtype=settings.dtype, port=settings.port)
        metrics = EngineMetrics()
        metrics.boot_generation.set(generation)
        dtype = torch.float64 if settings.dtype == "float64" else torch.float32
        model = await asyncio.to_thread(LlamaModel.load, settings.model, dtype)
        fingerprint = await asyncio.to_thread(weights_fingerprint, settings.model)
        scheduler = Scheduler(model, metrics, max_num_seqs=settings.max_num_seqs,
                              max_prefill_tokens=settings.max_prefill_tokens)
        faults = FaultInjector(FaultSettings(), metrics)
        state = EngineState(
            settings=settings,
            tokenizer=Tokenizer.from_file(str(settings.model / "tokenizer.json")),
            model=model,
            scheduler=scheduler,
            metrics=metrics,
            faults=faults,
            chat_template=_load_chat_template(settings.model),
            boot_generation=generation,
            weights_fingerprint=fingerprint,
            started_at=time.time(),
        )
        app.state.engine = state
        scheduler.start()
        faults.apply(fault_settings or FaultSettings(), model=model, scheduler=scheduler)
        await _self_test(state)
        state.ready = True
        metrics.ready.set(1)
        log.info("engine ready", weights=fingerprint)
        lease = _start_lease_client(state, settings.registry) if settings.registry else None
        try:
            yield
        finally:
            state.ready = False
            if lease is not None:
                await lease.stop()
            scheduler.stop()
            log.info("engine stopped")

    app = FastAPI(title="Lifeline reference engine", lifespan=lifespan)

    @app.exception_handler(EngineError)
    async def engine_error(_: Request, exc: EngineError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status_code)

    @app.middleware("http")
    async def stamp_generation(request: Request, call_next):  # type: ignore[no-untyped-def]
        response = await call_next(request)
        state: EngineState | None = getattr(request.app.state, "engine", None)
        if state is not None:
            response.headers["X-Lifeline-Instance"] = state.settings.instance_id
            response.headers["X-Lifeline-Generation"] = str(state.generation)
        return response

    def engine_state(request: Request) -> EngineState:
        return request.app.state.engine

    @app.get("/health")
    async def health(request: Request) -> Response:
        return Response(status_code=200 if engine_state(request).ready else 503)

    @app.get("/healthz/live")
    async def live() -> dict:
        return {"status": "live"}

    @app.get("/healthz/ready")
    async def ready(request: Request) -> JSONResponse:
        state = engine_state(request)
        if not state.ready:
            return JSONResponse({"status": "not_ready"}, status_code=503)
        return JSONResponse({"status": "ready"})

    @app.get("/healthz/generation")
    async def generation(request: Request) -> dict:
        state = engine_state(request)
        return {
            "instance_id": state.settings.instance_id,
            "generation": state.generation,
            "boot_generation": state.boot_generation,
            "weights_fingerprint": state.weights_fingerprint,
            "model": state.settings.model_name,
            "zone": state.settings.zone,
            "region": state.settings.region,
            "started_at": state.started_at,
        }

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        return Response(generate_latest(engine_state(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        state = engine_state(request)
        return {
            "object": "list",
            "data": [
                {
                    "id": state.settings.model_name,
                    "object": "model",
                    "created": int(state.started_at),
                    "owned_by": "lifeline",
                    "root": str(state.settings.model),
                    "max_model_len": state.model.shape.max_positions,
                }
            ],
        }

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        state = engine_state(request)
        body = await _parse(request, CompletionRequest)
        prompt_ids = _prompt_ids(state, body.prompt)
        return await _serve(state, body, prompt_ids, chat=False, caller_id=_caller_request_id(request))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        state = engine_state(request)
        body = await _parse(request, ChatCompletionRequest)
        if state.chat_template is None:
            raise BadRequest("this model has no chat template")
        rendered = ImmutableSandboxedEnvironment().from_string(state.chat_template).render(
            messages=[{"role": m.role, "content": m.text()} for m in body.messages],
            add_generation_prompt=body.add_generation_prompt,
        )
        prompt_ids = state.tokenizer.encode(rendered, add_special_tokens=False).ids
        return await _serve(state, body, prompt_ids, chat=True, caller_id=_caller_request_id(request))

    if settings.enable_fault_admin:

        @app.get("/admin/faults")
        async def get_faults(request: Request) -> dict:
            state = engine_state(request)
            return {**state.faults.settings.model_dump(), "tokens_sent": state.faults.tokens_sent}

        @app.post("/admin/faults")
        async def set_faults(request: Request) -> dict:
            state = engine_state(request)
            new = await _parse(request, FaultSettings)
            state.faults.apply(new, model=state.model, scheduler=state.scheduler)
            state.scheduler.wake()
            return {**state.faults.settings.model_dump(), "tokens_sent": state.faults.tokens_sent}

    return app


async def _parse(request: Request, model: type[Body]) -> Body:
    return parse_json_body(await request.body(), model, BadRequest)


def _prompt_ids(state: EngineState, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
        if not prompt:
            raise BadRequest("prompt must not be empty", param="prompt")
        return state.tokenizer.encode(prompt, add_special_tokens=False).ids
    if not prompt:
        raise BadRequest("prompt must not be empty", param="prompt")
    vocab = state.model.shape.vocab_size
    bad = [t for t in prompt if not 0 <= t < vocab]
    if bad:
        raise BadRequest(f"token id {bad[0]} is outside the vocabulary [0, {vocab})", param="prompt")
    return list(prompt)


def _validate(state: EngineState, body: EngineSampling, prompt_ids: list[int]) -> int:
    if body.model is not None and body.model != state.settings.model_name:
        raise BadRequest(f"model {body.model!r} does not exist; this engine serves {state.settings.model_name!r}", param="model")
    if not state.ready:
        raise NotReady("engine is not ready")
    limit = state.model.shape.max_positions
    max_tokens = body.max_tokens if body.max_tokens is not None else limit - len(prompt_ids)
    if max_tokens <= 0:
        raise BadRequest("max_tokens must be positive", param="max_tokens")
    if len(prompt_ids) + max_tokens > limit:
        raise BadRequest(
            f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceeds the context length {limit}",
            param="max_tokens",
        )
    if body.stop_token_ids and any(not 0 <= t < state.model.shape.vocab_size for t in body.stop_token_ids):
        raise BadRequest("stop_token_ids holds an id outside the vocabulary", param="stop_token_ids")
    return max_tokens


_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def _caller_request_id(request: Request) -> str | None:
    """`X-Request-Id`, as vLLM takes it: the gateway's request id, so one grep finds every hop."""
    value = request.headers.get("x-request-id")
    if value is None:
        return None
    if not _REQUEST_ID.fullmatch(value):
        raise BadRequest("X-Request-Id must be 1-128 characters of [A-Za-z0-9._:-]", param="X-Request-Id")
    return value


async def _serve(state: EngineState, body: EngineSampling, prompt_ids: list[int], *, chat: bool,
                 caller_id: str | None) -> Response:
    max_tokens = _validate(state, body, prompt_ids)
    if state.faults.take_request_failure():
        raise InjectedFailure("injected failure")
    request_id = ("chatcmpl-" if chat else "cmpl-") + (caller_id or uuid.uuid4().hex)
    sampling = SamplingParams(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, seed=body.seed)
    seed = body.seed if body.seed is not None else random.getrandbits(63)
    stop_ids = set(body.stop_token_ids or [])
    if not body.ignore_eos:
        stop_ids.add(state.model.shape.eos_token_id)
    logprobs = None
    if isinstance(body, CompletionRequest):
        logprobs = body.logprobs
    elif isinstance(body, ChatCompletionRequest) and body.logprobs:
        logprobs = body.top_logprobs or 0
    seq = Sequence(
        request_id=request_id,
        prompt_ids=prompt_ids,
        max_tokens=max_tokens,
        sampling=sampling,
        seed=seed,
        stop_token_ids=frozenset(stop_ids),
        logprobs=logprobs,
        loop=asyncio.get_running_loop(),
    )
    log.info("request accepted", request_id=request_id, prompt_tokens=len(prompt_ids), max_tokens=max_tokens, stream=body.stream)
    state.scheduler.submit(seq)
    shaper = _ChatShape(state, request_id, body) if chat else _CompletionShape(state, request_id, body)
    if body.stream:
        return StreamingResponse(_stream(state, seq, body, prompt_ids, shaper), media_type="text/event-stream")
    return await _collect(state, seq, body, prompt_ids, shaper)


class _CompletionShape:
    object_chunk = "text_completion"

    def __init__(self, state: EngineState, request_id: str, body: EngineSampling) -> None:
        self.state, self.request_id, self.body = state, request_id, body
        self.created = int(time.time())

    def choice(self, text: str, token_ids: list[int], events: list[TokenEvent], finish: str | None) -> dict:
        choice: dict = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        if self.body.return_token_ids:
            choice["token_ids"] = token_ids
        if isinstance(self.body, CompletionRequest) and self.body.logprobs is not None and events:
            decode = self.state.tokenizer.decode
            choice["logprobs"] = {
                "tokens": [decode([e.token_id]) for e in events],
                "token_logprobs": [e.logprob for e in events],
                "top_logprobs": [
                    {decode([t]): lp for t, lp in (e.top_logprobs or {}).items()} for e in events
                ],
                "text_offset": [],
            }
        return choice

    def envelope(self, choice: dict, *, final: bool) -> dict:
        return {
            "id": self.request_id,
            "object": self.object_chunk,
            "created": self.created,
            "model": self.state.settings.model_name,
            "choices": [choice],
        }

    def first_chunk(self) -> dict | None:
        return None


class _ChatShape(_CompletionShape):
    object_chunk = "chat.completion.chunk"

    def choice(self, text: str, token_ids: list[int], events: list[TokenEvent], finish: str | None) -> dict:
        choice: dict = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}
        if self.body.return_token_ids:
            choice["token_ids"] = token_ids
        return choice

    def first_chunk(self) -> dict | None:
        return self.envelope({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}, final=False)


def _usage(prompt_ids: list[int], output_ids: list[int]) -> dict:
    return {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": len(output_ids),
        "total_tokens": len(prompt_ids) + len(output_ids),
    }


async def _stream(
    state: EngineState, seq: Sequence, body: EngineSampling, prompt_ids: list[int], shape: _CompletionShape
) -> AsyncIterator[str]:
    generation = _Generation(state, seq, body.stop_strings())
    first = True
    try:
        if (opening := shape.first_chunk()) is not None:
            if body.return_token_ids:
                opening["prompt_token_ids"] = prompt_ids
            yield _sse(opening)
            first = False
        while True:
            event = await seq.events.get()
            if isinstance(event, ErrorEvent):
                yield _sse({"error": {"message": event.message, "type": "InternalServerError", "param": None, "code": 500}})
                return
            await state.faults.before_send()
            text = generation.accept(event)
            chunk = shape.envelope(shape.choice(text, [event.token_id], [event], generation.finish_reason), final=False)
            if first and body.return_token_ids:
                chunk["prompt_token_ids"] = prompt_ids
                chunk["choices"][0]["prompt_token_ids"] = prompt_ids
            first = False
            yield _sse(chunk)
            state.faults.sent(1)
            if generation.finish_reason is not None:
                break
        if body.stream_options is not None and body.stream_options.include_usage:
            usage_chunk = shape.envelope({}, final=True)
            usage_chunk["choices"] = []
            usage_chunk["usage"] = _usage(prompt_ids, seq.output_ids)
            yield _sse(usage_chunk)
        yield _sse("[DONE]")
        log.info("request finished", request_id=seq.request_id, tokens=len(seq.output_ids), finish_reason=generation.finish_reason)
    finally:
        seq.cancel()  # no-op if finished; stops decoding if the client went away


async def _collect(
    state: EngineState, seq: Sequence, body: EngineSampling, prompt_ids: list[int], shape: _CompletionShape
) -> JSONResponse:
    generation = _Generation(state, seq, body.stop_strings())
    events: list[TokenEvent] = []
    try:
        while generation.finish_reason is None:
            event = await seq.events.get()
            if isinstance(event, ErrorEvent):
                raise EngineError(event.message)
            await state.faults.before_send()
            generation.accept(event)
            events.append(event)
            state.faults.sent(1)
    finally:
        seq.cancel()
    token_ids = [e.token_id for e in events]
    if isinstance(shape, _ChatShape):
        choice: dict = {
            "index": 0,
            "message": {"role": "assistant", "content": generation.text},
            "logprobs": None,
            "finish_reason": generation.finish_reason,
        }
        if body.return_token_ids:
            choice["token_ids"] = token_ids
        obj = "chat.completion"
    else:
        choice = shape.choice(generation.text, token_ids, events, generation.finish_reason)
        obj = "text_completion"
    response = shape.envelope(choice, final=True)
    response["object"] = obj
    response["usage"] = _usage(prompt_ids, token_ids)
    if body.return_token_ids:
        response["prompt_token_ids"] = prompt_ids
        choice["prompt_token_ids"] = prompt_ids
    log.info("request finished", request_id=seq.request_id, tokens=len(token_ids), finish_reason=generation.finish_reason)
    return JSONResponse(response)


def _start_lease_client(state: EngineState, registry_url: str) -> LeaseClient:
    """Register only once ready: a lease means "route here"."""

    settings = state.settings
    registration = {
        "instance_id": settings.instance_id,
        "url": settings.advertise_url or f"http://{settings.host}:{settings.port}",
        "version": settings.model_name,
        "zone": settings.zone,
        "region": settings.region,
    }

    def adopt(generation: int) -> None:
        state.lease_generation = generation
        structlog.contextvars.bind_contextvars(generation=generation)

    def step_down() -> None:
        state.ready = False
        state.metrics.ready.set(0)

    client = LeaseClient(
        transport_for(registry_url, settings.registry_token, registration), on_generation=adopt, on_superseded=step_down
    )
    client.start()
    return client


async def _self_test(state: EngineState) -> None:
    """Generate a few greedy tokens end to end; readiness waits on this."""
    seq = Sequence(
        request_id="self-test",
        prompt_ids=state.tokenizer.encode(SELF_TEST_PROMPT, add_special_tokens=False).ids,
        max_tokens=4,
        sampling=SamplingParams(temperature=0.0),
        seed=0,
        stop_token_ids=frozenset(),
        logprobs=None,
        loop=asyncio.get_running_loop(),
    )
    state.scheduler.submit(seq)
    for _ in range(seq.max_tokens):
        event = await asyncio.wait_for(seq.events.get(), timeout=120)
        if isinstance(event, ErrorEvent):
            raise RuntimeError(f"self-test generation failed: {event.message}")
    log.info("self-test passed", tokens=seq.output_ids)
