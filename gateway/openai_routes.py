"""The OpenAI-compatible routes: completions, chat, models, stream resume and cancel. Thin: parse, delegate."""

from __future__ import annotations

import re

from fastapi import APIRouter, Request
from fastapi.responses import Response

from contract.mesh import COHORT_HEADER
from contract.openai import model_card, model_list
from gateway import serving
from gateway.errors import BadRequest
from gateway.prompts import chat_prompt, completion_prompt, read_body
from gateway.routing_table import ModelVersion, route_request
from gateway.schemas import ChatCompletionRequest, CompletionRequest
from gateway.state import State

router = APIRouter()

# A sequence number a stream sent (0, 1, 2, ...), or -1 for "from the start". Not `int()`: it takes `1_0`, `+1`,
# `-5`, non-ASCII digits and numbers past any stream's length, which the Redis token log turns into stream ids
# Redis refuses, mid-body. 15 digits: past any stream's length, and `seq + 2` is still a Redis stream id.
_CURSOR = re.compile(r"-1|[0-9]{1,15}")


def _route(request: Request, st: State, body: CompletionRequest | ChatCompletionRequest) -> ModelVersion:
    """The mesh tier's pick for a bare model name (X-Lifeline-Cohort, client key), else the name's version."""
    return route_request(st.table, body.model, cohort=request.headers.get(COHORT_HEADER),
                         client_key=request.headers.get("x-client-id") or body.user)


@router.get("/v1/models")
async def models(st: State) -> dict:
    return model_list([model_card(v.alias, root=v.version, max_model_len=v.max_model_len, owned_by="lifeline")
                       for v in st.table.versions()])


@router.post("/v1/completions")
async def completions(request: Request, st: State) -> Response:
    body = await read_body(request, CompletionRequest, max_bytes=st.settings.max_body_bytes)
    version = _route(request, st, body)
    prompt_ids = await completion_prompt(body, version, thread_above=st.settings.tokenize_in_thread_chars)
    return await serving.serve(st, request.headers, body, version, prompt_ids, kind="completion")


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, st: State) -> Response:
    body = await read_body(request, ChatCompletionRequest, max_bytes=st.settings.max_body_bytes)
    version = _route(request, st, body)
    prompt_ids = await chat_prompt(body, version, thread_above=st.settings.tokenize_in_thread_chars)
    return await serving.serve(st, request.headers, body, version, prompt_ids, kind="chat")


@router.get("/v1/streams/{request_id}")
async def resume(request: Request, request_id: str, st: State) -> Response:
    return await serving.resume(st, request_id, _resume_cursor(request))


def _resume_cursor(request: Request) -> str:
    """`Last-Event-ID`, else `?after=`, else -1; a 400 naming the one that is no sequence number."""
    header = request.headers.get("last-event-id")
    param, cursor = ("Last-Event-ID", header) if header is not None else ("after", request.query_params.get("after", "-1"))
    if not _CURSOR.fullmatch(cursor):
        raise BadRequest(f"{param} must be the sequence number of the last event received (or -1 for all)", param=param)
    return cursor


@router.delete("/v1/streams/{request_id}")
async def cancel(request_id: str, st: State) -> dict:
    return await serving.cancel(st, request_id)
