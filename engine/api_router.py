"""HTTP endpoints of the engine: thin handlers that parse and delegate.

    openai_router   POST /v1/completions, POST /v1/chat/completions, GET /v1/models
    health_router   GET /health, /healthz/live, /healthz/ready, /healthz/generation, /healthz/weights, /metrics
    admin_router    GET/POST /admin/faults (only with `--enable-fault-admin`)

The work happens in `engine.serving.OpenAIServing`; the process state is
`engine.runtime.EngineRuntime`. Both hang off `app.state`, built by the lifespan.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Annotated

import structlog
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from common.request_body import Body, parse_json_body
from contract.identity import EngineIdentity
from contract.openai import model_card, model_list
from contract.session import CHECKPOINT_PARAM
from engine.errors import BadRequest, DecodeLoopStalled
from engine.kv_router import checkpoint_prefix
from engine.protocol import ChatCompletionRequest, CompletionRequest
from engine.runtime import EngineRuntime
from engine.serving import OpenAIServing
from engine.settings import FaultSettings


def _runtime(request: Request) -> EngineRuntime:
    return request.app.state.runtime


def _serving(request: Request) -> OpenAIServing:
    return request.app.state.serving


Runtime = Annotated[EngineRuntime, Depends(_runtime)]
Serving = Annotated[OpenAIServing, Depends(_serving)]

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def caller_request_id(request: Request) -> str | None:
    """`X-Request-Id`, as vLLM takes it: the gateway's request id, so one grep finds every hop."""
    value = request.headers.get("x-request-id")
    if value is None:
        return None
    if not _REQUEST_ID.fullmatch(value):
        raise BadRequest("X-Request-Id must be 1-128 characters of [A-Za-z0-9._:-]", param="X-Request-Id")
    return value


# W3C trace context: version 00, a 32-hex trace id and a 16-hex parent id, neither all zeros, and flags.
_TRACEPARENT = re.compile(r"00-(?!0{32})([0-9a-f]{32})-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")


def trace_fields(request: Request) -> dict[str, str]:
    """`trace_id` for the request's log lines: the gateway attempt's W3C `traceparent`, so the engine's lines are
    found by the trace's id; an invalid header is ignored, as the W3C recommendation asks of a receiver."""
    match = _TRACEPARENT.fullmatch(request.headers.get("traceparent", ""))
    return {"trace_id": match.group(1)} if match else {}


async def parse_body(request: Request, model: type[Body]) -> Body:
    return parse_json_body(await request.body(), model, BadRequest)


openai_router = APIRouter()
health_router = APIRouter()
admin_router = APIRouter()


@openai_router.post("/v1/completions")
async def completions(request: Request, serving: Serving) -> Response:
    body = await parse_body(request, CompletionRequest)
    ask = body.checkpoint_ask()
    if ask is not None and (body.stream or isinstance(body.prompt, str)):
        raise BadRequest(f"kv_transfer_params.{CHECKPOINT_PARAM}: checkpointed completions are non-streamed, with "
                         "a prompt of token ids (contract.session.checkpoint_completion)", param="kv_transfer_params")
    with structlog.contextvars.bound_contextvars(**trace_fields(request)):  # the request's log lines
        response = await serving.create_completion(body, caller_request_id(request))
        if ask is None or response.status_code != 200:
            return response
        # As Lifeline's vLLM connector does: the prompt's full blocks, checkpointed once the completion is done.
        written = await checkpoint_prefix(_runtime(request), serving, list(body.prompt),  # type: ignore[arg-type]
                                          request_id=ask.request_id, session_class=ask.session_class)
        answer = json.loads(response.body)
        answer["kv_transfer_params"] = {CHECKPOINT_PARAM: written.model_dump()}
        return JSONResponse(answer, headers={k: v for k, v in response.headers.items() if k.startswith("x-")})


@openai_router.post("/v1/chat/completions")
async def chat_completions(request: Request, serving: Serving) -> Response:
    body = await parse_body(request, ChatCompletionRequest)
    with structlog.contextvars.bound_contextvars(**trace_fields(request)):
        return await serving.create_chat_completion(body, caller_request_id(request))


@openai_router.get("/v1/models")
async def models(runtime: Runtime) -> dict:
    card = model_card(runtime.settings.model_name, root=str(runtime.settings.model),
                      max_model_len=runtime.model.shape.max_positions, owned_by="lifeline")
    return model_list([card])


@health_router.get("/health")
async def health(runtime: Runtime) -> Response:
    return Response(status_code=200 if runtime.ready else 503)


@health_router.get("/healthz/live")
async def live(runtime: Runtime) -> dict:
    """Live means "can generate": 503 `decode_loop_stalled` while a decode step is over its bound (engine.watchdog)."""
    liveness = runtime.scheduler.watchdog.check()
    if not liveness.live:
        raise DecodeLoopStalled(liveness.reason)
    return {"status": "live", "step_age_s": liveness.step_age_s, "step_stall_bound_s": liveness.bound_s}


@health_router.get("/healthz/ready")
async def ready(runtime: Runtime, request: Request) -> JSONResponse:
    is_ready = runtime.ready  # one reading: the registry call below may outlast a state change
    body: dict[str, object] = {"status": "ready" if is_ready else "not_ready", "engine_status": runtime.status}
    lease = getattr(request.app.state, "lease_client", None)
    if lease is not None:
        try:  # which registry, and for Redis which server in which role (a failover shows here)
            body["lease_registry"] = await asyncio.wait_for(lease.registry_details(), timeout=1.0)
        except (TimeoutError, OSError, ConnectionError) as exc:
            body["lease_registry"] = {"reachable": False, "error": type(exc).__name__}
    return JSONResponse(body, status_code=200 if is_ready else 503)


@health_router.get("/healthz/generation", response_model=EngineIdentity)
async def generation(runtime: Runtime) -> EngineIdentity:
    return runtime.identity()


@health_router.get("/healthz/weights")
async def weights(runtime: Runtime) -> dict:
    """Where the weights came from: the memory holder, or disk (and why, when a holder was configured)."""
    return runtime.weights_origin.body()


@health_router.get("/metrics")
async def metrics(runtime: Runtime) -> Response:
    return Response(generate_latest(runtime.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@admin_router.get("/admin/faults")
async def get_faults(runtime: Runtime) -> dict:
    return runtime.faults.snapshot()


@admin_router.post("/admin/faults")
async def set_faults(request: Request, runtime: Runtime) -> dict:
    runtime.faults.apply(await parse_body(request, FaultSettings))
    runtime.scheduler.wake()
    return runtime.faults.snapshot()
