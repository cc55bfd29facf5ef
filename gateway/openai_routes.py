"""The OpenAI-compatible routes: completions, chat, models, stream resume and cancel. Thin: parse, delegate."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from contract.mesh import COHORT_HEADER
from contract.openai import model_card, model_list
from gateway import serving
from gateway.prompts import chat_prompt, completion_prompt, read_body
from gateway.routing_table import ModelVersion, route_request
from gateway.schemas import ChatCompletionRequest, CompletionRequest
from gateway.state import State

router = APIRouter()


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
    after = request.headers.get("last-event-id", request.query_params.get("after", "-1"))
    return await serving.resume(st, request_id, after)


@router.delete("/v1/streams/{request_id}")
async def cancel(request_id: str, st: State) -> dict:
    return await serving.cancel(st, request_id)
