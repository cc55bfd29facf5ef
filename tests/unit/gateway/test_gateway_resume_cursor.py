"""A resume cursor (`Last-Event-ID`, `?after=`) is a sequence number or -1; anything else is a 400 naming it.

Before, it went through `int()`, which also takes `1_0`, `+1`, `-5`, Arabic
digits and numbers past any stream's length; with the Redis token log
`-5` and `10**20` became stream ids Redis refuses, and the resume broke
off mid-body (tests/e2e/gateway/test_gateway_resume_hostile.py).
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.settings import GatewaySettings

GARBAGE = ["abc", "", "1_0", "+1", "-5", "-0", "1e3", "0x2", "2,3", "99999999999999999999", "9" * 5000,
           "\u0663".encode()]


@pytest.fixture
def client(tiny_model):
    settings = GatewaySettings(models=[{"alias": "tiny", "version": tiny_model.name, "model_dir": tiny_model}])
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        yield c


@pytest.mark.parametrize("cursor", GARBAGE)
def test_a_cursor_that_is_no_sequence_number_is_a_400_naming_it(client, cursor):
    for response, param in ((client.get("/v1/streams/cmpl-1", headers={"Last-Event-ID": cursor}), "Last-Event-ID"),
                            (client.get("/v1/streams/cmpl-1", params={"after": cursor}), "after")):
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", param)


@pytest.mark.parametrize("cursor", ["-1", "0", "41", "007"])
def test_a_sequence_number_reaches_the_token_log(client, cursor):
    response = client.get("/v1/streams/cmpl-1", headers={"Last-Event-ID": cursor})
    assert (response.status_code, response.json()["error"]["type"]) == (404, "not_found_error")
