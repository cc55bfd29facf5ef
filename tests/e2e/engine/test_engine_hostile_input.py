"""Hostile input on a real engine: typed 400/404/405 in the OpenAI shape, and the connection survives."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest

MODEL = "tiny-seed0"
DEEP = b'{"model": "tiny-seed0", "prompt": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"
SURROGATE_PROMPT = b'{"model": "tiny-seed0", "prompt": "cut over \\ud800 now", "max_tokens": 2}'
SURROGATE_CHAT = b'{"model": "tiny-seed0", "messages": [{"role": "user", "content": "hi \\udfff"}], "max_tokens": 2}'
FULL_CONTEXT = json.dumps({"model": MODEL, "prompt": [5] * 4096}).encode()  # tiny's whole context, no max_tokens
NEGATIVE_TOP_K = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2, "top_k": -2}).encode()
GOOD = json.dumps({"model": MODEL, "prompt": "The standby region", "max_tokens": 3, "temperature": 0,
                   "ignore_eos": True, "return_token_ids": True}).encode()


@pytest.fixture(scope="module")
def engine(module_engine_factory):
    return module_engine_factory("hostile-engine")


def _request(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None):
    headers = {"Content-Type": "application/json"} if body is not None else {}
    conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    return response, json.loads(response.read())


# (method, path, body) → (status, error type, param)
CASES = [
    (("POST", "/v1/completions", DEEP), (400, "BadRequestError", None)),
    (("POST", "/v1/completions", SURROGATE_PROMPT), (400, "BadRequestError", "prompt")),
    (("POST", "/v1/chat/completions", SURROGATE_CHAT), (400, "BadRequestError", "messages.0.content")),
    (("POST", "/v1/completions", FULL_CONTEXT), (400, "BadRequestError", "prompt")),
    (("POST", "/v1/completions", NEGATIVE_TOP_K), (400, "BadRequestError", "top_k")),
    (("GET", "/v1/completions", None), (405, "MethodNotAllowedError", None)),
    (("GET", "/v1/chat/completions", None), (405, "MethodNotAllowedError", None)),
    (("POST", "/v1/no-such-route", b"{}"), (404, "NotFoundError", None)),
]


@pytest.mark.parametrize(("request_", "expected"), CASES, ids=["deep-json", "surrogate-prompt", "surrogate-chat",
                                                                 "prompt-fills-the-context", "negative-top-k",
                                                                 "get-completions", "get-chat", "unknown-route"])
def test_hostile_request_gets_a_typed_openai_error(engine, request_: tuple, expected: tuple) -> None:
    conn = http.client.HTTPConnection(urlsplit(engine.url).netloc, timeout=30)
    response, body = _request(conn, *request_)
    status, error_type, param = expected
    assert response.status == status
    assert body["error"]["type"] == error_type and body["error"]["code"] == status
    assert body["error"]["param"] == param and body["error"]["message"]
    if status == 405:
        assert "POST" in response.getheader("Allow", "")
    conn.close()


def test_keep_alive_connection_survives_every_hostile_request(engine) -> None:
    conn = http.client.HTTPConnection(urlsplit(engine.url).netloc, timeout=30)
    response, first = _request(conn, "POST", "/v1/completions", GOOD)
    assert response.status == 200
    socket_in_use = conn.sock
    for request_, (status, _, _) in CASES:
        response, _ = _request(conn, *request_)
        assert response.status == status
        assert (response.getheader("Connection") or "").lower() != "close"
        assert conn.sock is socket_in_use, f"{request_[0]} {request_[1]} closed the connection"
    response, last = _request(conn, "POST", "/v1/completions", GOOD)
    assert response.status == 200 and conn.sock is socket_in_use
    assert last["choices"][0]["token_ids"] == first["choices"][0]["token_ids"]
    conn.close()
