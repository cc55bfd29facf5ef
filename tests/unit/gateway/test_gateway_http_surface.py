"""Bad input gets a clear OpenAI-shaped error and changes nothing: never a 500 (in-process app, no engines)."""

from __future__ import annotations

import threading

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.prompts import completion_prompt
from gateway.routing_table import ModelVersion
from gateway.schemas import CompletionRequest
from gateway.settings import GatewaySettings


@pytest.fixture
def client(tiny_model):
    settings = GatewaySettings(models=[{"alias": "tiny", "version": tiny_model.name, "model_dir": tiny_model}],
                               max_body_bytes=64 * 1024)
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        yield c


def _post(client, path: str, raw: str | bytes):
    return client.post(path, content=raw, headers={"content-type": "application/json"})


def _error(response) -> dict:
    body = response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["code"] == response.status_code
    return body["error"]


@pytest.mark.parametrize(("path", "raw", "param"), [
    ("/v1/completions", '{"model": "tiny", "prompt": "hello \\ud800 world"}', "prompt"),
    ("/v1/completions", '{"model": "tiny", "prompt": ["a", "\\udfff"]}', None),
    ("/v1/chat/completions", '{"model": "tiny", "messages": [{"role": "user", "content": "x\\udc00"}]}', "messages.0.content"),
    ("/v1/chat/completions", '{"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud83d"}]}]}',
     "messages.0.content.0.text"),
    ("/v1/completions", '{"model": "\\ud800", "prompt": "x"}', "model"),
])
def test_a_lone_surrogate_is_a_400_naming_the_field(client, path, raw, param):
    response = _post(client, path, raw)
    assert response.status_code == 400
    error = _error(response)
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_json_nested_thousands_deep_is_a_400(client, path):
    raw = '{"model": "tiny", "prompt": ' + "[" * 5000 + "]" * 5000 + "}"
    response = _post(client, path, raw)
    assert response.status_code == 400 and _error(response)["type"] == "invalid_request_error"


def test_a_get_on_a_post_route_is_a_405_in_the_openai_shape(client):
    response = client.get("/v1/completions")
    assert response.status_code == 405
    assert _error(response)["type"] == "method_not_allowed"
    assert "POST" in response.headers["allow"]


def test_an_unknown_route_is_a_404_in_the_openai_shape(client):
    response = client.get("/v1/nothing-here")
    assert response.status_code == 404 and _error(response)["type"] == "not_found_error"


def test_a_bad_query_parameter_is_a_400_naming_it(client):
    response = client.delete("/lifeline/v1/leases/e1", params={"generation": "x"})
    assert response.status_code == 400  # not FastAPI's 422 with {"detail": [...]}
    assert _error(response)["param"] == "generation"


@pytest.mark.parametrize("field", [{"logprobs": True}, {"top_logprobs": 2}])
def test_chat_logprobs_are_refused_as_documented(client, field):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **field}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400 and _error(response)["param"] == next(iter(field))


def test_completion_logprobs_are_refused_as_documented(client):
    response = client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "logprobs": 0})
    assert response.status_code == 400 and _error(response)["param"] == "logprobs"


def test_a_body_over_the_limit_is_a_413_in_the_openai_shape(client):
    response = client.post("/v1/completions", json={"model": "tiny", "prompt": "x" * (70 * 1024)})
    assert response.status_code == 413 and _error(response)["type"] == "request_too_large"


def test_a_chunked_body_over_the_limit_is_a_413_too(client):
    def chunks():
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(80):
            yield b"x" * 1024
        yield b'"}'

    response = client.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413 and _error(response)["type"] == "request_too_large"


def test_the_app_still_answers_after_malformed_requests(client):
    for raw in ('{"model": "tiny", "prompt": "\\ud800"}', "{" * 3000, "not json"):
        assert _post(client, "/v1/completions", raw).status_code == 400
    assert client.get("/healthz/live").json() == {"status": "live"}


async def test_large_prompts_are_tokenized_off_the_event_loop(tiny_model):
    version = ModelVersion("tiny", tiny_model.name, tiny_model)
    real = version.tokenizer
    threads: list[bool] = []

    class Recording:
        def __getattr__(self, name):
            threads.append(threading.current_thread() is threading.main_thread())
            return getattr(real, name)

    version.__dict__["tokenizer"] = Recording()  # cached_property: replace the loaded tokenizer
    small = await completion_prompt(CompletionRequest(model="tiny", prompt="short"), version, thread_above=1000)
    large = await completion_prompt(CompletionRequest(model="tiny", prompt="word " * 400), version, thread_above=1000)
    assert threads == [True, False]  # the short prompt on the loop, the long one in a worker thread
    assert large == real.encode("word " * 400, add_special_tokens=False).ids and small
