"""The gateway's HTTP surface: OpenAI-compatible front, stream resume, leases, health.

`create_app(settings)` builds nothing at import; the lifespan builds the
routing table, lease registry, token log, router and engine client and keeps
them on `app.state.gateway`. Errors are `GatewayError`s rendered by one
handler; after the first byte of a stream they become SSE `error` events.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import random
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from jinja2.sandbox import ImmutableSandboxedEnvironment
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.admission import Admission
from gateway.controlplane_link import build_controlplane_link
from common.clock import Clock, SystemClock
from gateway.engine_client import EngineClient
from gateway.errors import BadRequest, GatewayError, NotFound, Unauthorized
from contract.lease import LeaseRegistry, RedisLeaseRegistry, Registration
from gateway.lease_registry import InMemoryLeaseRegistry
from gateway.metrics import GatewayMetrics
from gateway.recovery import OPENED, Deps, StreamRequest, StreamSession
from gateway.router import LeaseView, Router
from gateway.routing_table import ModelVersion, RoutingTable, StaticRoutingTable
from gateway.schemas import ChatCompletionRequest, CompletionRequest, GatewaySampling, LeaseRegistration, LeaseRenewal
from gateway.settings import GatewaySettings, RecoveryStrategy
from gateway.token_log import Frame, MemoryTokenLog, RedisTokenLog, TokenLog
from common.logs import get_logger
from common.request_body import Body, parse_json_body

log = get_logger(__name__)
_TERMINAL_KINDS = ("done", "error")


@dataclass
class GatewayState:
    settings: GatewaySettings
    table: RoutingTable
    registry: LeaseRegistry
    view: LeaseView
    token_log: TokenLog
    deps: Deps
    metrics: GatewayMetrics


def _build_registry(settings: GatewaySettings, clock: Clock) -> LeaseRegistry:
    cfg = settings.registry
    if cfg.kind == "redis":
        assert cfg.url is not None  # validated in settings
        return RedisLeaseRegistry.from_url(cfg.url, region=settings.region, prefix=cfg.key_prefix, ttl=cfg.ttl)
    return InMemoryLeaseRegistry(cfg.ttl, clock, state_path=cfg.state_dir / "generations.json" if cfg.state_dir else None)


def _build_token_log(settings: GatewaySettings, clock: Clock) -> TokenLog:
    cfg = settings.token_log
    if cfg.kind == "redis":
        assert cfg.url is not None
        return RedisTokenLog.from_url(cfg.url, prefix=cfg.key_prefix, retention=cfg.retention, owner_ttl=cfg.owner_ttl)
    return MemoryTokenLog(retention=cfg.retention, owner_ttl=cfg.owner_ttl, clock=clock)


class FrameStreamResponse(StreamingResponse):
    """A StreamingResponse that notices a client leaving even between tokens and always closes its iterator.

    Closing the iterator closes the engine stream, and the engine then drops the
    sequence from its batch: a client that leaves costs at most one more decode step.
    """

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        streaming = asyncio.create_task(self.stream_response(send))

        async def watch_disconnect() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    streaming.cancel()
                    return

        watcher = asyncio.create_task(watch_disconnect())
        try:
            await streaming
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # we are being cancelled ourselves (shutdown), not the client leaving
        except OSError:
            pass  # the client left while we wrote
        finally:
            watcher.cancel()
            streaming.cancel()
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


def create_app(settings: GatewaySettings, *, clock: Clock | None = None) -> FastAPI:
    clock = clock or SystemClock()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        structlog.contextvars.bind_contextvars(replica=settings.replica_id)
        metrics = GatewayMetrics()
        link = build_controlplane_link(settings, clock, metrics.registry)
        table: RoutingTable
        if link.routing is not None:
            table = link.routing
        else:
            table = StaticRoutingTable(settings.models, settings.engines)
            for version in table.versions():
                version.tokenizer  # noqa: B018 - load now so a bad model_dir stops start-up
        registry = _build_registry(settings, clock)
        view = link.wrap_view(LeaseView(registry, refresh_interval=settings.registry.refresh_interval.total_seconds(), cached=settings.registry.kind == "redis"))
        await view.start()
        token_log = _build_token_log(settings, clock)
        router = Router(settings, table, view, Admission(settings.admission), clock)
        link.attach(router)
        await link.start(router, view)
        engines = EngineClient(connect_timeout=settings.recovery.connect_timeout.total_seconds())
        deps = Deps(settings, router, engines, token_log, metrics, clock, settings.replica_id)
        app.state.gateway = GatewayState(settings, table, registry, view, token_log, deps, metrics)
        log.info("gateway ready", registry=settings.registry.kind, token_log=settings.token_log.kind, port=settings.port)
        try:
            yield
        finally:
            await link.stop()
            await view.stop()
            await engines.close()
            await token_log.close()
            await registry.close()

    app = FastAPI(title="Lifeline gateway", lifespan=lifespan)

    @app.exception_handler(GatewayError)
    async def gateway_error(_: Request, exc: GatewayError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status_code, headers=exc.headers())

    def state(request: Request) -> GatewayState:
        return request.app.state.gateway

    # -- health and metrics ------------------------------------------------------
    @app.get("/healthz/live")
    async def live() -> dict:
        return {"status": "live"}

    @app.get("/healthz/ready")
    async def ready(request: Request) -> JSONResponse:
        st = state(request)
        routable = {v.alias: len(await st.deps.router.endpoints(v.version)) for v in st.table.versions()}
        ok = any(routable.values())
        return JSONResponse({"status": "ready" if ok else "not_ready", "routable_endpoints": routable}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        return Response(generate_latest(state(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        st = state(request)
        return {
            "object": "list",
            "data": [
                {"id": v.alias, "object": "model", "created": 0, "owned_by": "lifeline", "root": v.version, "max_model_len": v.max_model_len}
                for v in st.table.versions()
            ],
        }

    # -- inference ------------------------------------------------------------------
    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await _parse(request, CompletionRequest)
        version = state(request).table.resolve(body.model)
        if isinstance(body.prompt, str):
            if not body.prompt:
                raise BadRequest("prompt must not be empty", param="prompt")
            prompt_ids = version.tokenizer.encode(body.prompt, add_special_tokens=False).ids
        else:
            if not body.prompt:
                raise BadRequest("prompt must not be empty", param="prompt")
            vocab = version.tokenizer.get_vocab_size()
            if any(not 0 <= t < vocab for t in body.prompt):
                raise BadRequest(f"prompt holds a token id outside the vocabulary [0, {vocab})", param="prompt")
            prompt_ids = list(body.prompt)
        return await _serve(request, body, version, prompt_ids, kind="completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await _parse(request, ChatCompletionRequest)
        version = state(request).table.resolve(body.model)
        if version.chat_template is None:
            raise BadRequest(f"model {body.model!r} has no chat template", param="model")
        rendered = ImmutableSandboxedEnvironment().from_string(version.chat_template).render(
            messages=[{"role": m.role, "content": m.text()} for m in body.messages], add_generation_prompt=True,
        )
        prompt_ids = version.tokenizer.encode(rendered, add_special_tokens=False).ids
        return await _serve(request, body, version, prompt_ids, kind="chat")

    async def _serve(request: Request, body: GatewaySampling, version: ModelVersion, prompt_ids: list[int], *, kind: str) -> Response:
        st = state(request)
        received_at = clock.now()
        req = _stream_request(request, st.settings, body, version, prompt_ids, kind=kind)
        structlog.contextvars.bind_contextvars(request_id=req.request_id)
        await st.token_log.create(req.request_id, req.to_dict(), owner=st.settings.replica_id)
        session = StreamSession(st.deps, req, version.tokenizer, received_at=received_at)
        frames = session.run()
        try:
            first = await anext(frames)
        except StopAsyncIteration:  # pragma: no cover - run() always opens or raises
            raise GatewayError("stream ended before it started") from None
        except GatewayError:
            await frames.aclose()
            raise
        assert first is OPENED
        headers = {"X-Lifeline-Request-Id": req.request_id}
        if req.stream:
            return FrameStreamResponse(_sse_body(req, frames), media_type="text/event-stream", headers=headers)
        return await _collect(req, frames, headers)

    # -- resume -------------------------------------------------------------------------
    @app.get("/v1/streams/{request_id}")
    async def resume(request: Request, request_id: str) -> Response:
        st = state(request)
        record = await st.token_log.get(request_id)
        if record is None:
            raise NotFound(f"no stream {request_id!r} (unknown, or older than the retention window)")
        raw_after = request.headers.get("last-event-id", request.query_params.get("after", "-1"))
        try:
            after = int(raw_after)
        except ValueError:
            raise BadRequest("Last-Event-ID must be the integer sequence number of the last event received", param="Last-Event-ID") from None
        req = StreamRequest.from_dict(record.request)
        version = st.table.resolve(req.model)
        body = _sse_body(req, _follow(st, req, version, after))
        return FrameStreamResponse(body, media_type="text/event-stream", headers={"X-Lifeline-Request-Id": request_id})

    @app.delete("/v1/streams/{request_id}")
    async def cancel(request: Request, request_id: str) -> dict:
        st = state(request)
        if await st.token_log.get(request_id) is None:
            raise NotFound(f"no stream {request_id!r}")
        cancelled = await st.token_log.cancel(request_id)
        return {"request_id": request_id, "cancelled": cancelled}

    # -- leases (the in-process registry's endpoint; works for Redis too) ----------------------
    def authorize(request: Request) -> None:
        token = st_token = state(request).settings.registry.token
        if not st_token:
            raise Unauthorized("the lease endpoint is disabled: set registry.token")
        presented = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(presented.encode(), token.encode()):
            state(request).metrics.lease_rejections.labels(type="unauthorized").inc()
            raise Unauthorized("bad or missing bearer token")

    @app.post("/lifeline/v1/leases", status_code=201)
    async def register(request: Request) -> dict:
        authorize(request)
        body = await _parse(request, LeaseRegistration)
        st = state(request)
        if body.region != st.settings.region:
            raise BadRequest(f"region {body.region!r} is not this gateway's region {st.settings.region!r}", param="region")
        if body.version not in {v.version for v in st.table.versions()}:
            raise BadRequest(f"version {body.version!r} is not served through this gateway", param="version")
        lease = await st.registry.register(Registration(**body.model_dump()))
        log.info("lease registered", instance=lease.instance_id, generation=lease.generation, url=lease.url)
        return {**lease.public(), "ttl_s": st.registry.ttl.total_seconds()}

    @app.put("/lifeline/v1/leases/{instance_id}")
    async def renew(request: Request, instance_id: str) -> dict:
        authorize(request)
        body = await _parse(request, LeaseRenewal)
        st = state(request)
        try:
            lease = await st.registry.renew(instance_id, body.generation)
        except GatewayError as exc:
            st.metrics.lease_rejections.labels(type=exc.error_type).inc()
            raise
        return {**lease.public(), "ttl_s": st.registry.ttl.total_seconds()}

    @app.delete("/lifeline/v1/leases/{instance_id}")
    async def release(request: Request, instance_id: str, generation: int) -> dict:
        authorize(request)
        await state(request).registry.release(instance_id, generation)
        log.info("lease released", instance=instance_id, generation=generation)
        return {"released": True}

    @app.get("/lifeline/v1/leases")
    async def leases(request: Request) -> dict:
        authorize(request)
        return {"leases": [lease.public() for lease in await state(request).registry.live()]}

    return app


def _stream_request(request: Request, settings: GatewaySettings, body: GatewaySampling, version: ModelVersion,
                    prompt_ids: list[int], *, kind: str) -> StreamRequest:
    strategy_header = request.headers.get("x-lifeline-recovery")
    try:
        strategy = RecoveryStrategy(strategy_header) if strategy_header else settings.recovery.strategy
    except ValueError:
        raise BadRequest(f"X-Lifeline-Recovery must be one of {[s.value for s in RecoveryStrategy]}", param="X-Lifeline-Recovery") from None
    timeout_s = settings.recovery.request_timeout.total_seconds()
    if raw := request.headers.get("x-lifeline-timeout-ms"):
        try:
            timeout_s = float(raw) / 1000.0
        except ValueError:
            raise BadRequest("X-Lifeline-Timeout-Ms must be a number", param="X-Lifeline-Timeout-Ms") from None
        if timeout_s <= 0:
            raise BadRequest("X-Lifeline-Timeout-Ms must be positive", param="X-Lifeline-Timeout-Ms")
    limit = version.max_model_len
    budget = body.token_budget()
    max_tokens = budget if budget is not None else limit - len(prompt_ids)
    if max_tokens <= 0 or len(prompt_ids) + max_tokens > limit:
        raise BadRequest(f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceeds the context length {limit}", param="max_tokens")
    seed = body.seed
    if seed is None and body.temperature > 0:
        # Position-keyed engines then continue a migrated sampled stream token-identically.
        seed = random.getrandbits(63)
    prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
    return StreamRequest(
        request_id=prefix + uuid.uuid4().hex,
        kind=kind,
        model=body.model,
        version=version.version,
        prompt_ids=prompt_ids,
        max_tokens=max_tokens,
        sampling={
            "temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k, "seed": seed,
            "stop_token_ids": body.stop_token_ids, "ignore_eos": body.ignore_eos, "n": body.n,
        },
        stop=body.stop_strings(),
        strategy=strategy,
        deadline_wall=time.time() + timeout_s,
        created=int(time.time()),
        stream=body.stream,
        include_usage=bool(body.stream_options and body.stream_options.include_usage) or not body.stream,
        return_token_ids=body.return_token_ids,
        client_key=request.headers.get("x-client-id") or body.user,
        prefer_instance=request.headers.get("x-lifeline-prefer-instance"),
        resumable=body.n == 1,
    )


async def _follow(st: GatewayState, req: StreamRequest, version: ModelVersion, after: int) -> AsyncIterator[Frame]:
    """Frames after `after` from the log, then the live stream: tail it, or drive it if nobody does."""
    rid = req.request_id
    last = after
    owner_ttl = st.settings.token_log.owner_ttl.total_seconds()
    st.metrics.resumes.labels(mode="replay").inc()
    while True:
        for frame in await st.token_log.frames_after(rid, last):
            yield frame
            last = frame.seq
            if frame.kind in _TERMINAL_KINDS:
                return
        record = await st.token_log.get(rid)
        if record is None:
            return
        if record.status.terminal:
            for frame in await st.token_log.frames_after(rid, last):
                yield frame
            return
        if await st.token_log.owner(rid) is None:
            if await st.token_log.advance_epoch(rid, record.epoch, owner=st.settings.replica_id):
                st.metrics.resumes.labels(mode="takeover").inc()
                frames = await st.token_log.frames_after(rid, -1)
                session = StreamSession.from_log(st.deps, req, version.tokenizer, epoch=record.epoch + 1, frames=frames,
                                                 migrations=record.migrations)  # read under the epoch we just CAS'd
                log.info("resuming stream", request_id=rid, committed=len(session.committed), epoch=session.epoch)
                async with aclosing(session.run()) as items:
                    async for item in items:
                        if isinstance(item, Frame) and item.seq > last:
                            yield item
                return
            continue  # someone else claimed it first: tail them
        for frame in await st.token_log.wait_frames(rid, last, timeout=owner_ttl):
            yield frame
            last = frame.seq
            if frame.kind in _TERMINAL_KINDS:
                return


def _envelope(req: StreamRequest, frame: Frame, choices: list[dict]) -> dict:
    return {
        "id": req.request_id,
        "object": "chat.completion.chunk" if req.kind == "chat" else "text_completion",
        "created": req.created,
        "model": req.model,
        "choices": choices,
        "lifeline": {"request_id": req.request_id, "seq": frame.seq, "epoch": frame.epoch},
    }


def render_frame(req: StreamRequest, frame: Frame) -> str:
    if frame.kind == "done":
        return f"id: {frame.seq}\ndata: [DONE]\n\n"
    if frame.kind == "error":
        payload = {"error": frame.error, "lifeline": {"request_id": req.request_id, "seq": frame.seq, "epoch": frame.epoch}}
        return f"id: {frame.seq}\nevent: error\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n"
    if frame.kind == "usage":
        chunk = _envelope(req, frame, [])
        chunk["usage"] = frame.usage
    elif frame.kind == "role":
        chunk = _envelope(req, frame, [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}])
    else:
        if req.kind == "chat":
            delta = {"content": frame.text} if frame.token_ids else {}
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": frame.finish_reason}
        else:
            choice = {"index": 0, "text": frame.text, "logprobs": None, "finish_reason": frame.finish_reason}
        if req.return_token_ids:
            choice["token_ids"] = list(frame.token_ids)
        chunk = _envelope(req, frame, [choice])
    return f"id: {frame.seq}\ndata: {json.dumps(chunk, separators=(',', ':'))}\n\n"


_json_str = json.encoder.encode_basestring_ascii  # what json.dumps does to a str (ensure_ascii)


class FrameRenderer:
    """`render_frame` for one request, with the envelope encoded once instead of per token.

    A token frame is the request's constant envelope around three variable
    parts (text, finish_reason, token ids) and the lifeline seq/epoch; building
    and encoding the nested dicts per token was the largest cost of SSE
    encoding. The output is byte-identical to `render_frame` (a unit test
    holds them equal); every other kind of frame takes `render_frame`.
    """

    def __init__(self, req: StreamRequest) -> None:
        self.req = req
        rid = _json_str(req.request_id)
        obj = "chat.completion.chunk" if req.kind == "chat" else "text_completion"
        self.chat = req.kind == "chat"
        self.token_ids = req.return_token_ids
        self.head = f'data: {{"id":{rid},"object":"{obj}","created":{req.created},"model":{_json_str(req.model)},"choices":[{{"index":0,'
        self.lifeline = f'}}],"lifeline":{{"request_id":{rid},"seq":'

    def render(self, frame: Frame) -> str:
        if frame.kind != "token":
            return render_frame(self.req, frame)
        if self.chat:
            variable = f'"delta":{{"content":{_json_str(frame.text)}}}' if frame.token_ids else '"delta":{}'
        else:
            variable = f'"text":{_json_str(frame.text)}'
        finish = "null" if frame.finish_reason is None else _json_str(frame.finish_reason)
        ids = f',"token_ids":[{",".join(map(str, frame.token_ids))}]' if self.token_ids else ""
        return (f"id: {frame.seq}\n{self.head}{variable},\"logprobs\":null,\"finish_reason\":{finish}{ids}"
                f'{self.lifeline}{frame.seq},"epoch":{frame.epoch}}}}}\n\n')


async def _sse_body(req: StreamRequest, frames: AsyncIterator[Any]) -> AsyncIterator[str]:
    render = FrameRenderer(req).render
    async with aclosing(frames) as items:
        async for item in items:
            if isinstance(item, Frame):
                yield render(item)


async def _collect(req: StreamRequest, frames: AsyncIterator[Any], headers: dict[str, str]) -> JSONResponse:
    text: list[str] = []
    token_ids: list[int] = []
    finish: str | None = None
    usage: dict[str, int] | None = None
    epoch = 0
    async with aclosing(frames) as items:
        async for item in items:
            if not isinstance(item, Frame):
                continue
            epoch = item.epoch
            if item.kind == "error":
                error = item.error or {}
                return JSONResponse({"error": error}, status_code=int(error.get("code") or 502), headers=headers)
            if item.kind == "token":
                text.append(item.text)
                token_ids.extend(item.token_ids)
                finish = item.finish_reason or finish
            elif item.kind == "usage":
                usage = item.usage
    content = "".join(text)
    if req.kind == "chat":
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": content}, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": content, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    if req.return_token_ids:
        choice["token_ids"] = token_ids
    body = {
        "id": req.request_id, "object": obj, "created": req.created, "model": req.model, "choices": [choice],
        "usage": usage, "lifeline": {"request_id": req.request_id, "epoch": epoch},
    }
    return JSONResponse(body, headers=headers)


async def _parse(request: Request, model: type[Body]) -> Body:
    return parse_json_body(await request.body(), model, BadRequest)
