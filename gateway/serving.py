"""The serving layer: turn a parsed request into a stream session and its HTTP response.

Routes (`openai_routes.py`) stay thin: they parse, resolve the model, build
the prompt and call `serve()`; resume and cancel live here too. Nothing here
knows FastAPI's routing; it gets headers as a mapping and the typed state.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing

import structlog
from fastapi.responses import Response

from common.logs import get_logger
from gateway.errors import BadRequest, GatewayError, NotFound
from gateway.recovery import OPENED, StreamSession, cancelled_frames
from gateway.routing_table import ModelVersion
from gateway.schemas import ChatCompletionRequest, GatewaySampling
from gateway.settings import GatewaySettings, RecoveryStrategy
from gateway.sse import FrameStreamResponse, collect, sse_body
from gateway.state import GatewayState
from gateway.stream_request import StreamRequest
from gateway.stream_status import StreamStatus
from gateway.token_log import Frame

log = get_logger(__name__)
_TERMINAL_KINDS = ("done", "error")


async def serve(st: GatewayState, headers: Mapping[str, str], body: GatewaySampling, version: ModelVersion,
                prompt_ids: list[int], *, kind: str) -> Response:
    """Start the stream; answer once the first engine accepted it (or with its error before the first byte)."""
    if refused := body.refused_field():
        raise BadRequest(refused[1], param=refused[0])
    clock = st.deps.clock
    received_at = clock.now()
    req = stream_request(headers, st.settings, body, version, prompt_ids, kind=kind, wall=clock.wall())
    structlog.contextvars.bind_contextvars(request_id=req.request_id)
    turn = await st.sessions.open(headers, body, version, prompt_ids)
    await st.token_log.create(req.request_id, req.to_dict(), owner=st.settings.replica_id)
    session = StreamSession(st.deps, req, version.tokenizer, received_at=received_at, turn=turn, headers=headers)
    frames = session.run()
    try:
        first = await anext(frames)
    except StopAsyncIteration:  # pragma: no cover - run() always opens or raises
        raise GatewayError("stream ended before it started") from None
    except GatewayError:
        await frames.aclose()
        raise
    if first is not OPENED:  # pragma: no cover - run() yields OPENED first
        raise GatewayError("stream opened out of order")
    response_headers = {"X-Lifeline-Request-Id": req.request_id}
    if req.stream:
        return FrameStreamResponse(sse_body(req, frames), media_type="text/event-stream", headers=response_headers)
    return await collect(req, frames, response_headers)


def stream_request(headers: Mapping[str, str], settings: GatewaySettings, body: GatewaySampling, version: ModelVersion,
                   prompt_ids: list[int], *, kind: str, wall: float) -> StreamRequest:
    """The request as the session and the token log keep it; `wall` is the injected clock's Unix time."""
    strategy_header = headers.get("x-lifeline-recovery")
    try:
        strategy = RecoveryStrategy(strategy_header) if strategy_header else settings.recovery.strategy
    except ValueError:
        raise BadRequest(f"X-Lifeline-Recovery must be one of {[s.value for s in RecoveryStrategy]}", param="X-Lifeline-Recovery") from None
    timeout_s = settings.recovery.request_timeout.total_seconds()
    if raw := headers.get("x-lifeline-timeout-ms"):
        try:
            timeout_s = float(raw) / 1000.0
        except ValueError:
            raise BadRequest("X-Lifeline-Timeout-Ms must be a number", param="X-Lifeline-Timeout-Ms") from None
        if not timeout_s > 0:
            raise BadRequest("X-Lifeline-Timeout-Ms must be positive", param="X-Lifeline-Timeout-Ms")
    limit = version.max_model_len
    budget = body.token_budget()
    if budget is None and len(prompt_ids) >= limit:
        raise BadRequest(f"prompt ({len(prompt_ids)} tokens) leaves no room for output in the context length {limit}",
                         param="messages" if kind == "chat" else "prompt")
    max_tokens = budget if budget is not None else limit - len(prompt_ids)
    if max_tokens <= 0 or len(prompt_ids) + max_tokens > limit:
        raise BadRequest(f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceeds the context length {limit}", param="max_tokens")
    inexact_ok = _continuation_header(headers.get("x-lifeline-continuation"), client_seeded=body.seed is not None)
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
        sampling={**body.engine_fields(), "seed": seed},
        stop=body.stop_strings(),
        strategy=strategy,
        deadline_wall=wall + timeout_s,
        created=int(wall),
        stream=body.stream,
        include_usage=body.include_usage() or not body.stream,
        return_token_ids=body.return_token_ids,
        client_key=headers.get("x-client-id") or body.user,
        prefer_instance=headers.get("x-lifeline-prefer-instance"),
        stateful=body.stateful(),
        inexact_continuation_ok=inexact_ok,
        parse_tool_calls=isinstance(body, ChatCompletionRequest) and body.tool_calling(),
        max_tool_calls=1 if isinstance(body, ChatCompletionRequest) and body.parallel_tool_calls is False else None,
    )


def _continuation_header(raw: str | None, *, client_seeded: bool) -> bool:
    """Whether a sampled stream may continue inexactly: `X-Lifeline-Continuation`, else only if the gateway seeded it.

    A client that sent a `seed` asked for reproducible output: by default its stream ends `not_resumable` rather
    than continue differently. One that sent none gets a gateway seed and a continuation that may differ, said.
    """
    if raw is None:
        return not client_seeded
    value = raw.strip().lower()
    if value not in CONTINUATION_VALUES:
        raise BadRequest(f"X-Lifeline-Continuation must be one of {sorted(CONTINUATION_VALUES)}",
                         param="X-Lifeline-Continuation")
    return CONTINUATION_VALUES[value]


CONTINUATION_VALUES = {"exact": False, "may-differ": True}


async def resume(st: GatewayState, request_id: str, last_event_id: str) -> Response:
    """`GET /v1/streams/{id}`: every frame after `last_event_id`, then the live stream."""
    record = await st.token_log.get(request_id)
    if record is None:
        raise NotFound(f"no stream {request_id!r} (unknown, or older than the retention window)")
    try:
        after = int(last_event_id)
    except ValueError:
        raise BadRequest("Last-Event-ID must be the integer sequence number of the last event received", param="Last-Event-ID") from None
    req = StreamRequest.from_dict(record.request)
    # The version the stream started on, not what its name resolves to now (an alias move, a mesh split).
    version = st.table.resolve(req.version)
    # Tool calls are split from the text by what came before: the frames the client has are read again first.
    history = [f for f in await st.token_log.frames_after(request_id, -1) if f.seq <= after] \
        if req.parse_tool_calls else []
    body = sse_body(req, follow(st, req, version, after), history)
    return FrameStreamResponse(body, media_type="text/event-stream", headers={"X-Lifeline-Request-Id": request_id})


async def cancel(st: GatewayState, request_id: str) -> dict:
    if await st.token_log.get(request_id) is None:
        raise NotFound(f"no stream {request_id!r}")
    cancelled = await st.token_log.cancel(request_id)
    return {"request_id": request_id, "cancelled": cancelled}


async def follow(st: GatewayState, req: StreamRequest, version: ModelVersion, after: int) -> AsyncIterator[Frame]:
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
                last = frame.seq
            if record.status is StreamStatus.CANCELLED:
                for frame in cancelled_frames(last + 1, record.epoch):
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
