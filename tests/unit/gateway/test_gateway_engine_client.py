"""How engine responses map to failures, with httpx's mock transport standing in for the engine."""

from __future__ import annotations

import json

import httpx
import pytest

from gateway.engine_client import EngineClient, EngineFailure, EngineRejected, EngineToken, Opened
from gateway.router import Endpoint

pytestmark = pytest.mark.unit

ENDPOINT = Endpoint("eng-a", 3, "http://eng-a", "v", "z")
SSE = {"content-type": "text/event-stream"}


def _sse(*token_ids: int, finish_last: bool = True) -> bytes:
    lines = []
    for i, t in enumerate(token_ids):
        finish = "length" if finish_last and i == len(token_ids) - 1 else None
        lines.append("data: " + json.dumps({"choices": [{"token_ids": [t], "text": "x", "finish_reason": finish}]}) + "\n\n")
    return "".join(lines).encode()


def _client(handler) -> EngineClient:
    client = EngineClient(connect_timeout=1.0)
    client.http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return client


async def _collect(client: EngineClient) -> list:
    return [item async for item in client.stream(ENDPOINT, {}, first_token_timeout=1, stall_timeout=1)]


async def test_tokens_of_the_routed_generation_pass():
    client = _client(lambda r: httpx.Response(200, headers={**SSE, "x-lifeline-generation": "3"}, content=_sse(5, 6, 7)))
    items = await _collect(client)
    assert items == [Opened(3), EngineToken(5, None), EngineToken(6, None), EngineToken(7, "length")]


async def test_frames_from_another_generation_are_dropped():
    client = _client(lambda r: httpx.Response(200, headers={**SSE, "x-lifeline-generation": "4"}, content=_sse(5, 6)))
    with pytest.raises(EngineFailure) as failure:
        await _collect(client)
    assert failure.value.reason == "stale_generation"


@pytest.mark.parametrize(("response", "reason"), [
    (httpx.Response(500, json={"error": {"message": "boom"}}), "http_500"),
    (httpx.Response(503, json={}), "http_503"),
    (httpx.Response(200, headers=SSE, content=_sse(5, 6, finish_last=False)), "stream_ended"),
    (httpx.Response(200, headers=SSE, content=b'data: {"error": {"message": "oom"}}\n\n'), "engine_error"),
    (httpx.Response(200, content=b'{"choices": []}'), "bad_response"),
    (httpx.Response(200, headers=SSE, content=b"data: not json\n\n"), "bad_response"),
])
async def test_engine_failures_are_classified(response, reason):
    with pytest.raises(EngineFailure) as failure:
        await _collect(_client(lambda r: response))
    assert failure.value.reason == reason


async def test_client_errors_are_not_migrated():
    client = _client(lambda r: httpx.Response(400, json={"error": {"message": "too long", "type": "BadRequestError"}}))
    with pytest.raises(EngineRejected) as rejected:
        await _collect(client)
    assert rejected.value.status_code == 400


async def test_connect_refused_is_a_failure():
    def refuse(request):
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(EngineFailure) as failure:
        await _collect(_client(refuse))
    assert failure.value.reason == "connect"
