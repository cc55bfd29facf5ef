"""Nothing is stripped silently: constrained decoding is forwarded, grammar state is not resumed, the rest is refused."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.engine_client import EngineFailure
from gateway.errors import BadRequest
from gateway.schemas import ChatCompletionRequest, CompletionRequest
from gateway.serving import stream_request
from gateway.settings import GatewaySettings
from gateway.routing_table import ModelVersion
from tests.unit.gateway.scripted import OPEN, Harness, frames_of

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def client(tiny_model):
    settings = GatewaySettings(models=[{"alias": "tiny", "version": tiny_model.name, "model_dir": tiny_model}])
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        yield c


@pytest.mark.parametrize(("path", "extra", "param"), [
    ("/v1/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"},
     "tool_choice"),
    ("/v1/chat/completions", {"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ("/v1/chat/completions", {"tool_choice": "auto"}, "tool_choice"),
    ("/v1/chat/completions", {"functions": [{"name": "f"}]}, "functions"),
    ("/v1/completions", {"best_of": 3}, "best_of"),
    ("/v1/completions", {"suffix": "!"}, "suffix"),
    ("/v1/completions", {"min_tokens": 4}, "min_tokens"),
])
def test_a_field_the_gateway_cannot_forward_is_a_400_naming_it(client, path, extra, param):
    body = {**CHAT, **extra} if "chat" in path else {"model": "tiny", "prompt": "hi", **extra}
    response = client.post(path, json=body)
    assert response.status_code == 400, response.json()
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize("extra", [{"metadata": {"k": "v"}}, {"store": False}, {"tool_choice": "none"}, {"tools": []},
                                   {"tools": [{"type": "function", "function": {"name": "f"}}]},
                                   {"response_format": {"type": "json_object"}}, {"logit_bias": {"5": -100}}])
def test_fields_the_gateway_forwards_or_that_change_nothing_pass_validation(client, extra):
    response = client.post("/v1/chat/completions", json={**CHAT, **extra})
    assert response.status_code == 503  # validated and routed; no engine runs in this test
    assert response.json()["error"]["type"] == "no_healthy_endpoint"


def test_bad_logit_bias_is_a_400(client):
    response = client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "logit_bias": {"the": 1}})
    assert response.status_code == 400 and response.json()["error"]["param"] == "logit_bias"


def _request(tiny_model, body):
    settings = GatewaySettings(models=[{"alias": "tiny", "version": tiny_model.name, "model_dir": tiny_model}])
    return stream_request({}, settings, body, ModelVersion("tiny", tiny_model.name, tiny_model), [1, 2, 3],
                          kind="completion", wall=1000.0)


def test_constrained_decoding_is_forwarded_and_marks_the_request_stateful(tiny_model):
    body = CompletionRequest.model_validate({
        "model": "tiny", "prompt": "x", "logit_bias": {"7": 5.0}, "guided_regex": "[0-9]+",
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}},
    })
    req = _request(tiny_model, body)
    assert req.sampling["logit_bias"] == {"7": 5.0} and req.sampling["guided_regex"] == "[0-9]+"
    assert req.sampling["response_format"]["json_schema"]["schema"] == {"type": "integer"}
    assert req.stateful
    only_bias = _request(tiny_model, CompletionRequest.model_validate({"model": "tiny", "prompt": "x", "logit_bias": {"7": 5.0}}))
    assert not only_bias.stateful  # the same bias at every position: a continuation is exact


def test_chat_penalties_keep_output_state():
    body = ChatCompletionRequest.model_validate({**CHAT, "presence_penalty": 0.5})
    assert body.stateful() and body.engine_fields()["presence_penalty"] == 0.5
    assert not ChatCompletionRequest.model_validate(CHAT).stateful()


async def test_a_stateful_stream_ends_not_resumable_after_its_first_committed_token(tiny_model):
    h = Harness(tiny_model, ["a", "b"])
    await h.register()
    h.engines.script("a", OPEN, 5, EngineFailure("connection_lost"))
    frames = await frames_of((await h.session(max_tokens=3, prefer="a", stateful=True)).run())
    error = next(f.error for f in frames if f.kind == "error")
    assert error["type"] == "not_resumable"
    assert [t for f in frames for t in f.token_ids] == [5]  # nothing resumed wrongly


async def test_a_stateful_stream_may_still_move_before_its_first_token(tiny_model):
    h = Harness(tiny_model, ["a", "b"])
    await h.register()
    h.engines.script("a", EngineFailure("connect"))
    h.engines.script("b", OPEN, 5, ("finish", 6))
    frames = await frames_of((await h.session(max_tokens=2, prefer="a", stateful=True)).run())
    assert [t for f in frames for t in f.token_ids] == [5, 6] and not any(f.kind == "error" for f in frames)
    assert h.engines.payloads[1][1]["prompt"] == [1, 2, 3]  # the grammar starts afresh with the same prompt


async def test_a_client_resume_of_a_stateful_stream_ends_not_resumable(tiny_model):
    """A client that reconnects after a hang-up must not get a continuation whose grammar restarted."""
    from gateway.recovery import StreamSession
    from gateway.token_log import Frame

    h = Harness(tiny_model, ["a"])
    await h.register()
    session = await h.session(max_tokens=4, stateful=True)
    frames = [Frame(seq=0, kind="token", epoch=1, token_ids=(5,), text="x")]
    resumed = StreamSession.from_log(h.deps, session.request, h.tokenizer, epoch=1, frames=frames, migrations=0)
    out = await frames_of(resumed.run())
    assert [f.kind for f in out] == ["token", "error"] and out[1].error["type"] == "not_resumable"
    assert h.engines.payloads == []  # nothing was sent to an engine


def test_a_prompt_that_fills_the_context_without_max_tokens_names_the_prompt(tiny_model):
    settings = GatewaySettings(models=[{"alias": "tiny", "version": tiny_model.name, "model_dir": tiny_model}])
    version = ModelVersion("tiny", tiny_model.name, tiny_model)
    body = CompletionRequest.model_validate({"model": "tiny", "prompt": "x"})
    with pytest.raises(BadRequest, match="leaves no room for output") as refused:
        stream_request({}, settings, body, version, [1] * version.max_model_len, kind="completion", wall=1000.0)
    assert refused.value.param == "prompt"
    one_short = stream_request({}, settings, body, version, [1] * (version.max_model_len - 1), kind="completion",
                               wall=1000.0)
    assert one_short.max_tokens == 1


def test_top_k_below_minus_one_is_a_400(client):
    response = client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "top_k": -2})
    assert response.status_code == 400 and response.json()["error"]["param"] == "top_k"
    assert client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "top_k": 0}).status_code == 503


@pytest.mark.parametrize(("path", "extra", "param"), [
    ("/v1/completions", {"n": 2}, "n"),
    ("/v1/chat/completions", {"n": 3}, "n"),
    ("/v1/completions", {"best_of": 2}, "best_of"),
])
def test_several_candidates_are_a_400_that_says_why(client, path, extra, param):
    """Each candidate would need its own committed log; a stock vLLM would interleave them into one stream."""
    body = {**CHAT, **extra} if "chat" in path else {"model": "tiny", "prompt": "hi", **extra}
    response = client.post(path, json=body)
    assert response.status_code == 400, response.json()
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert "committed token log" in error["message"]


@pytest.mark.parametrize("extra", [{"n": 1}, {"best_of": 1}, {"n": 1, "best_of": 1}])
def test_one_candidate_asked_for_explicitly_is_fine(client, extra):
    response = client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", **extra})
    assert response.status_code == 503 and response.json()["error"]["type"] == "no_healthy_endpoint"


def test_n_is_not_forwarded_and_a_stored_request_with_resumable_still_loads(tiny_model):
    from gateway.stream_request import StreamRequest

    req = _request(tiny_model, CompletionRequest.model_validate({"model": "tiny", "prompt": "x", "n": 1}))
    assert "n" not in req.sampling and "best_of" not in req.sampling
    stored = {**req.to_dict(), "resumable": True}  # as gateways before this one wrote it to Redis
    assert StreamRequest.from_dict(stored) == req
