"""The shared body parser (common.request_body) refuses hostile JSON with the typed 400, never a 500."""

from __future__ import annotations

import pytest

from common.request_body import parse_json_body
from engine.errors import BadRequest
from engine.protocol import ChatCompletionRequest, CompletionRequest


@pytest.mark.parametrize("raw", [
    b"[" * 100_000,
    b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    b'{"model": "m", "unknown": ' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"}",
], ids=["bare-array", "in-a-field", "in-an-ignored-field"])
def test_json_nested_thousands_deep_is_a_bad_request(raw: bytes) -> None:
    with pytest.raises(BadRequest, match="nested too deeply"):
        parse_json_body(raw, CompletionRequest, BadRequest)


@pytest.mark.parametrize(("raw", "model", "param"), [
    (b'{"prompt": "drain \\ud800 now", "max_tokens": 2}', CompletionRequest, "prompt"),
    ('{"prompt": "raw \ud800 bytes"}'.encode("utf-8", "surrogatepass"), CompletionRequest, "prompt"),
    (b'{"prompt": "x", "stop": ["ok", "\\udfff"]}', CompletionRequest, "stop.1"),
    (b'{"messages": [{"role": "user", "content": "hi \\udc00"}]}', ChatCompletionRequest, "messages.0.content"),
    (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud83d"}]}]}', ChatCompletionRequest,
     "messages.0.content.0.text"),
])
def test_lone_surrogate_is_a_bad_request_naming_the_field(raw: bytes, model: type, param: str) -> None:
    with pytest.raises(BadRequest, match="lone UTF-16 surrogate") as caught:
        parse_json_body(raw, model, BadRequest)
    assert caught.value.param == param


def test_surrogate_pairs_and_escaped_backslashes_are_fine() -> None:
    body = parse_json_body(b'{"prompt": "\\ud83d\\ude80 and \\\\ud800 literally", "max_tokens": 1}',
                           CompletionRequest, BadRequest)
    assert body.prompt == "\U0001f680 and \\ud800 literally"
