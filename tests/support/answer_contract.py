"""Every answer a test receives is one the app's own OpenAPI document describes.

The document is the contract, not a description of it: an httpx response
hook on the integration suite's control-plane `TestClient` judges every
answer any test gets, on SQLite and PostgreSQL, against the app's own
document (what `/openapi.json` serves: `app.openapi()`), so a route, a
status or a field the suite reaches is checked without anyone listing it.

An answer to an operation the document lists (method and path template):

- its status is one the operation lists, or the operation has `default`;
- its body validates against that status's schema for its content type
  (schemathesis' `validate_response`, the validator the contract test
  already used: it resolves the document's `$ref`s, picks the media type
  and decodes JSON, NDJSON and text bodies the way the document says).

An answer to a request the document does not list (an unknown path, a
method a path does not take, the console's pages, `/metrics`, the
document itself) has no operation to be judged by, so it is judged by the
one promise the document makes for every refusal: an error (status 400 or
more) is JSON in the `ErrorResponse` shape, validated with jsonschema
against the document's own component. The console under /console is a UI
the document does not describe (docs/console.md): its refusals are pages
for people (`controlplane.console.web.install_error_pages`) or plain
answers its page's scripts read (the live fleet fragment and the event
stream say "signed out" as text, the timeline image is an empty 404), so
there only a JSON error is held to the shape. A success outside the
document (a console page, the metrics exposition) is not the API's to
describe, but under `/api/` there is none: an API answer the document does
not list is a violation.

And every answer, listed or not: no timestamp without a UTC offset
(`offsetless`, over the JSON or NDJSON body, or over the words of a
markdown, HTML or plain-text answer). SQLite stores datetimes as naive
text, so that is where one slips through. The console's pages, fragments
and event stream are left out of this one rule: they print times for
people as "2026-01-01 00:00:00 UTC", the zone a word of its own.

The hook never raises: it collects, and the fixture fails the test at
teardown with every violation listed, after the test's own assertions ran.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import jsonschema
import schemathesis
from fastapi.testclient import TestClient

# "2026-01-01T00:00:00", with a date-time separator and at least minutes: what an ISO-8601 date-time starts with.
DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?")
WITH_OFFSET = re.compile(r"(Z|[+-]\d{2}:\d{2})$")
ERROR_SHAPE = "#/components/schemas/ErrorResponse"
WORD = r"[^\s<>\"']*"  # a word of text or of markup: HTML's tags and attribute quotes end one
PROSE = "()[]{}<>.,;:!?'\"`*_|"  # around a timestamp in text; an offset ends in a digit or Z, so none of it is lost


def offsetless(value: Any, where: str = "$") -> list[str]:
    """Every string under `value` that reads as a date-time and has no UTC offset, with its JSON path."""
    if isinstance(value, dict):
        return [bad for key, item in value.items() for bad in offsetless(item, f"{where}.{key}")]
    if isinstance(value, list):
        return [bad for index, item in enumerate(value) for bad in offsetless(item, f"{where}[{index}]")]
    date_time = isinstance(value, str) and (DATE_TIME.fullmatch(value.rstrip("Z"))
                                            or (DATE_TIME.match(value) and len(value) <= 40))
    if date_time and not WITH_OFFSET.search(value):
        return [f"{where} = {value!r}"]
    return []


def answer_body(response: Any) -> Any:
    """The body as data: JSON, NDJSON as a list of lines, else the date-time-looking words of the text.

    A word ends at markup (`<`, `>`, quotes) and loses the punctuation prose puts around it
    ("at 2026-01-01T00:00:00+00:00." in markdown, "...+00:00.</p>" in HTML).
    """
    kind = response.headers.get("content-type", "")
    if "json" in kind and "ndjson" not in kind:
        return response.json()
    lines = [line for line in response.text.splitlines() if line.strip()]
    try:
        return [json.loads(line) for line in lines]
    except ValueError:
        return [found.group(0).strip(PROSE) for found in re.finditer(WORD + DATE_TIME.pattern + WORD, response.text)]


@dataclass
class Document:
    """One app's document, loaded once: schemathesis' operations, and a validator for the shared error shape."""

    operations: Any
    error_shape: jsonschema.protocols.Validator

    @classmethod
    def of(cls, document: dict[str, Any]) -> Document:
        shape = {"$ref": ERROR_SHAPE, "components": document["components"]}
        return cls(operations=schemathesis.openapi.from_dict(document),
                   error_shape=jsonschema.Draft202012Validator(shape))


_BY_ROUTES: dict[tuple, Document] = {}  # every test builds its own app, mostly with the same routes
_BY_APP: weakref.WeakKeyDictionary[Any, Document] = weakref.WeakKeyDictionary()


def document_of(app: Any) -> Document:
    """`app`'s document (`app.openapi()`, what /openapi.json serves), built once per distinct set of routes.

    FastAPI builds a document in about a second for this app, and every test makes its own app: keyed by
    its routes (path, methods, endpoint, response model), the suite builds one per router set, not per test.
    """
    if app not in _BY_APP:
        routes = tuple((getattr(r, "path", ""), tuple(sorted(getattr(r, "methods", None) or ())),
                        getattr(getattr(r, "endpoint", None), "__qualname__", ""),
                        repr(getattr(r, "response_model", None)), repr(getattr(r, "responses", None)))
                       for r in getattr(app, "routes", ()))
        if routes not in _BY_ROUTES:
            _BY_ROUTES[routes] = Document.of(app.openapi())
        _BY_APP[app] = _BY_ROUTES[routes]
    return _BY_APP[app]


@dataclass
class Tally:
    """How many answers the hook judged in this session, and how many broke the document (the summary line)."""

    answers: int = 0
    violations: int = 0


TALLY = Tally()


@dataclass
class AnswerContract:
    """The violations of one test's answers; `watch` puts a client under it, `verdict` lists what broke."""

    violations: list[str] = field(default_factory=list)
    answers: int = 0
    broken: int = 0  # answers with one violation or more

    def watch(self, client: TestClient, *, app: Any = None) -> TestClient:
        """Judge every answer `client` receives against the document of `app` (the client's own app by default).

        `app` is for a client over a wrapped app (middleware a test adds around the FastAPI app).
        """
        documented = app if app is not None else client.app
        hooks = client.event_hooks
        client.event_hooks = {**hooks, "response": [*hooks["response"], self._hook(documented)]}
        return client

    def _hook(self, app: Any) -> Callable[[httpx.Response], None]:
        def judge(response: httpx.Response) -> None:
            response.read()  # the TestClient has the whole body; a streaming caller still reads it from the buffer
            try:
                found = violations(document_of(app), response)
            except Exception as failure:  # noqa: BLE001 - never raise inside the client: the test's assertions run
                found = [f"{response.request.method} {response.request.url.path}: the check itself failed: {failure!r}"]
            self.answers += 1
            self.broken += bool(found)
            self.violations += found
            TALLY.answers += 1
            TALLY.violations += len(found)

        return judge

    def verdict(self) -> str | None:
        """None when every answer kept the document; else every violation, one a line."""
        if not self.violations:
            return None
        return (f"{self.broken} of the test's {self.answers} answers broke the OpenAPI document "
                f"(tests/support/answer_contract.py):\n" + "\n".join(self.violations))


def violations(document: Document, response: httpx.Response) -> list[str]:
    """What is wrong with `response` against `document`; [] when nothing is."""
    request = response.request
    where = f"{request.method} {request.url.raw_path.decode('ascii', 'replace')} -> {response.status_code}"
    found = [f"{where}: timestamp without a UTC offset: {bad}" for bad in _offsetless_in(response)]
    operation = document.operations.find_operation_by_path(request.method, request.url.path)
    if operation is not None:
        return found + _against_operation(operation, response, where)
    return found + _outside_the_document(document, response, where)


def _offsetless_in(response: httpx.Response) -> list[str]:
    kind = response.headers.get("content-type", "")
    # the console's pages, fragments and event stream print "2026-01-01 00:00:00 UTC" for people (console.web._when)
    for_people = response.request.url.path.startswith("/console") and "json" not in kind
    if not response.content or for_people:
        return []
    try:
        return offsetless(answer_body(response))
    except ValueError:  # JSON that does not parse: the schema check names it
        return []


def _against_operation(operation: Any, response: httpx.Response, where: str) -> list[str]:
    listed = operation.definition.raw["responses"]
    if str(response.status_code) not in listed and "default" not in listed:
        return [(f"{where}: status not in the document for {operation.label} ({sorted(listed)}): "
                 f"{response.text[:200]}")]
    try:
        operation.validate_response(_for_schemathesis(response))
    except Exception as failure:  # noqa: BLE001 - schemathesis raises one failure, or a group of them
        return [(f"{where}: body violates {operation.label}'s {response.status_code} schema: "
                 f"{' '.join(str(failure).split())[:400]}")]
    return []


def _for_schemathesis(response: httpx.Response) -> schemathesis.Response:
    """The answer as schemathesis' own Response, with only the method and URL of its request.

    `Response.from_any` re-prepares the whole request with `requests`, which
    refuses some headers a test sends on purpose (an If-None-Match with
    leading whitespace); the request is only the answer's context, and no
    response schema reads its headers.
    """
    import requests

    request = requests.Request(method=response.request.method, url=str(response.request.url)).prepare()
    return schemathesis.Response(
        status_code=response.status_code, headers={key: [value] for key, value in response.headers.items()},
        content=response.content, request=request, elapsed=response.elapsed.total_seconds(),
        message=response.reason_phrase, encoding=response.encoding, http_version=response.http_version,
        verify=True)


def _outside_the_document(document: Document, response: httpx.Response, where: str) -> list[str]:
    path = response.request.url.path
    kind = response.headers.get("content-type", "")
    if response.status_code < 400:
        if path.startswith("/api/"):
            return [f"{where}: an API answer to an operation the document does not list"]
        return []
    if path.startswith("/console") and not kind.startswith("application/json"):
        return []  # the console's error page (install_error_pages), or a plain refusal its page's script reads
    if not kind.startswith("application/json"):
        return [f"{where}: an error that is not the documented JSON error shape ({kind!r}): {response.text[:200]}"]
    try:
        body = response.json()
    except ValueError:
        return [f"{where}: an error whose body is not JSON: {response.text[:200]}"]
    problems = [error.message for error in document.error_shape.iter_errors(body)]
    if problems:
        return [f"{where}: an error not in the documented ErrorResponse shape: {'; '.join(problems)[:300]}"]
    return []
