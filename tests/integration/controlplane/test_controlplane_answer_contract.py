"""The per-answer check (tests/support/answer_contract.py) finds what it promises to, against the real document.

Every other test's answers pass through it, so a check that found nothing
would look exactly like an API that breaks nothing: here each kind of
violation is handed to it, built by hand, and must be named.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from controlplane.app import create_app
from controlplane.config import ControlPlaneSettings
from tests.support.answer_contract import document_of, violations

REGION = {"name": "eu", "description": "", "created_at": "2026-01-01T00:00:00Z"}
ERROR = {"error": {"message": "no such region", "type": "region_not_found", "param": None, "code": 404}}


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> Any:
    url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'unused.sqlite3'}"  # the document needs no database
    return document_of(create_app(ControlPlaneSettings(database_url=url, data_dir=Path(url[10:]).parent)))


def answer(method: str, path: str, status: int, body: Any = None, *, text: str | None = None,
           content_type: str = "application/json") -> httpx.Response:
    request = httpx.Request(method, f"http://testserver{path}")
    content = text.encode() if text is not None else httpx.Response(200, json=body).content
    response = httpx.Response(status, content=content, headers={"content-type": content_type}, request=request)
    response.read()
    response.elapsed = timedelta(0)  # what the client's transport sets on a real answer
    return response


@pytest.mark.parametrize(("response", "found"), [
    (answer("GET", "/api/v1/regions/eu", 418, ERROR), "status not in the document for GET /api/v1/regions/{region}"),
    (answer("GET", "/api/v1/regions/eu", 200, {"name": "eu"}), "body violates GET /api/v1/regions/{region}'s 200"),
    # in a string the schema does not type as a date-time: only the timestamp rule sees it
    (answer("POST", "/api/v1/regions", 201, {**REGION, "description": "2026-01-01T00:00:00"}),
     "timestamp without a UTC offset: $.description = '2026-01-01T00:00:00'"),
    (answer("GET", "/api/v1/regions/eu", 404, {"detail": "Not Found"}), "body violates"),
    (answer("GET", "/api/v1/nowhere", 404, {"detail": "Not Found"}), "not in the documented ErrorResponse shape"),
    (answer("PUT", "/api/v1/regions", 405, text="Method Not Allowed", content_type="text/plain"),
     "an error that is not the documented JSON error shape"),
    (answer("GET", "/api/v1/hidden", 200, {}), "an API answer to an operation the document does not list"),
    (answer("GET", "/api/v1/slo/m", 200, text="<p>at 2026-01-01T00:00:00.</p>", content_type="text/html"),
     "timestamp without a UTC offset: $[0] = '2026-01-01T00:00:00'"),
], ids=["undocumented-status", "body-off-schema", "naive-timestamp", "error-off-schema", "unknown-path-shape",
        "non-json-error", "undocumented-api-success", "naive-timestamp-in-html"])
def test_each_kind_of_violation_is_named(document: Any, response: httpx.Response, found: str) -> None:
    named = violations(document, response)
    assert len(named) == 1 and found in named[0], named


@pytest.mark.parametrize("response", [
    answer("GET", "/api/v1/regions/eu", 200, REGION),
    answer("GET", "/api/v1/regions/eu", 404, ERROR),
    answer("GET", "/api/v1/nowhere", 404, {**ERROR, "error": {**ERROR["error"], "type": "not_found"}}),
    answer("GET", "/console/fleet/live", 401, text="signed out", content_type="text/plain"),
    answer("GET", "/metrics", 200, text="lifeline_up 1\n", content_type="text/plain"),
], ids=["documented", "documented-error", "unknown-path-error", "console-refusal", "metrics"])
def test_answers_that_keep_the_document_pass(document: Any, response: httpx.Response) -> None:
    assert violations(document, response) == []
