"""Text JSON cannot carry is a 400 naming the field at the gateway, never a 500 (in-process app, no engines).

Before: a lone surrogate in an object key (`logit_bias`) was a plain-text 500
(the error naming the key could not be encoded), and `Infinity` in a field
without a bound (`repetition_penalty`) passed validation to be forwarded.
The engine parses with the same `common.request_body`.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from common.request_body import text_defect
from gateway.app import create_app
from gateway.settings import GatewaySettings

CHAT = '{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], %s}'
COMPLETION = '{"model": "tiny", "prompt": "hi", %s}'


@pytest.fixture
def client(tiny_model):
    settings = GatewaySettings(models=[{"alias": "tiny", "version": tiny_model.name, "model_dir": tiny_model}])
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        yield c


@pytest.mark.parametrize(("path", "raw", "param"), [
    ("/v1/completions", COMPLETION % '"logit_bias": {"\\ud800": 1}', "logit_bias.\\ud800"),
    ("/v1/chat/completions", CHAT % '"repetition_penalty": Infinity', "repetition_penalty"),
    ("/v1/chat/completions", CHAT % '"repetition_penalty": 1e400', "repetition_penalty"),
    ("/v1/completions", COMPLETION % '"logit_bias": {"7": NaN}', "logit_bias.7"),
    ("/v1/completions", COMPLETION % '"top_p": -Infinity', "top_p"),
    ("/v1/chat/completions", CHAT % ('"repetition_penalty": ' + "9" * 320 + ".5"), "repetition_penalty"),
])
def test_non_finite_numbers_and_surrogate_keys_are_a_400_naming_the_field(client, path, raw, param):
    response = client.post(path, content=raw.encode(), headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, 400)


@pytest.mark.parametrize("raw", [b'{"x": 1e308, "y": "1e999 in a string", "z": "NaN", "w": "\\\\ud800 literally"}',
                                 b'{"x": 1e-400}', b"not json NaN", b'{"x": [1, 2]}', b'{"x": ' + b"9" * 400 + b"}"])
def test_finite_numbers_and_lookalikes_in_strings_are_not_defects(raw):
    assert text_defect(raw) is None
