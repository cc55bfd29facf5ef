from __future__ import annotations

import json

import pytest

from common.request_body import parse_json_body
from engine.errors import BadRequest
from engine.protocol import ChatCompletionRequest, CompletionRequest


@pytest.mark.parametrize(("field", "value"), [
    ("logit_bias", {"5": 10.0}),
    ("response_format", {"type": "json_object"}),
    ("guided_regex", "[a-z]+"),
    ("guided_choice", ["yes", "no"]),
    ("presence_penalty", 0.5),
    ("repetition_penalty", 1.2),
])
def test_constrained_decoding_is_refused_naming_the_field(field: str, value: object) -> None:
    body = json.dumps({"prompt": "hi", field: value}).encode()
    with pytest.raises(BadRequest) as refused:
        parse_json_body(body, CompletionRequest, BadRequest)
    assert refused.value.param == field


def test_no_op_values_are_served() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "text"},
            "presence_penalty": 0.0, "repetition_penalty": 1.0, "logit_bias": None}
    parsed = parse_json_body(json.dumps(body).encode(), ChatCompletionRequest, BadRequest)
    assert parsed.constraint_fields() == {}


@pytest.mark.parametrize(("model", "body", "field"), [
    (CompletionRequest, {"prompt": "hi", "echo": True}, "echo"),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}], "logprobs": True}, "logprobs"),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
])
def test_fields_the_answer_would_leave_out_are_refused_naming_the_field(model: type, body: dict, field: str) -> None:
    """Served as if absent, `echo` would answer without the prompt and a chat answer without its logprobs."""
    with pytest.raises(BadRequest) as refused:
        parse_json_body(json.dumps(body).encode(), model, BadRequest)
    assert refused.value.param == field


def test_a_completions_logprobs_and_echo_false_are_served() -> None:
    parsed = parse_json_body(json.dumps({"prompt": "hi", "logprobs": 2, "echo": False}).encode(),
                             CompletionRequest, BadRequest)
    assert parsed.logprobs == 2


def test_kv_transfer_params_serve_lifeline_checkpoints_only() -> None:
    """The gateway's checkpoint request parses as what it asks; anything else a connector would take is refused."""
    from contract.session import KVCheckpointRequest, checkpoint_completion

    asked = checkpoint_completion("tiny", KVCheckpointRequest(token_ids=[1, 2, 3], request_id="s#1", session_class="c"))
    parsed = parse_json_body(json.dumps(asked).encode(), CompletionRequest, BadRequest)
    ask = parsed.checkpoint_ask()
    assert ask is not None and (ask.request_id, ask.session_class) == ("s#1", "c")
    for other in ({"do_remote_decode": True}, {"lifeline_checkpoint": {"unknown": 1}}):
        with pytest.raises(BadRequest) as refused:
            parse_json_body(json.dumps({**asked, "kv_transfer_params": other}).encode(), CompletionRequest, BadRequest)
        assert refused.value.param is not None and refused.value.param.startswith("kv_transfer_params")
