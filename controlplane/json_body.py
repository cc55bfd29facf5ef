"""Pure ASGI middleware: refuse a JSON body holding text JSON cannot carry, with 422 `invalid_request`.

FastAPI reads bodies with `json.loads`, which takes `NaN`, `Infinity`, `1e400`
(read as infinity) and lone UTF-16 surrogates (`"\\ud800"`), and pydantic
lets them into `str`, `float` and `dict` fields. Stored, they broke later:
a surrogate made every read of a gateway report a 500 (no UTF-8 form), and a
non-finite number was a 201 on SQLite but a 422 on PostgreSQL, then read back
as `null`. The gateway and the engine refuse the same text in
`common.request_body`; this runs its `text_defect` on every control-plane
body before routing, so nothing parses, stores or audits a value that cannot
be sent back. An ordinary body costs a few byte scans (8 ms for a 1 MB
gateway report, load 1.7 on 2 cores); `text_defect` parses and walks only a
body that may hold one. Not-JSON is left to FastAPI's own 422, except a
JSON body that is not UTF-8 (`\xff`), which FastAPI answered 400
`http_error` "There was an error parsing the body", a status the OpenAPI
document lists nowhere: it is refused here as 422 `invalid_request` naming
`body`, like any other body that is no JSON.

It sits inside `BodyLimitMiddleware`, which has already read the body whole,
and replays what it read.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from common.errors import error_body
from common.logs import get_logger
from common.request_body import TextDefect, text_defect

log = get_logger(__name__)


class JsonBodyMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        chunks: list[bytes] = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        raw = b"".join(chunks)
        defect = text_defect(raw)
        if defect is None and _declares_json(scope) and not _is_utf8(raw):
            defect = TextDefect("the body is not UTF-8 text, so it is no JSON", "body")
        if defect is not None:
            log.info("json_body_refused", path=scope.get("path"), param=defect.param)
            body = json.dumps(error_body("invalid_request", defect.message, param=defect.param, code=422)).encode()
            await send({"type": "http.response.start", "status": 422,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


def _declares_json(scope: Scope) -> bool:
    for name, value in scope.get("headers") or []:
        if name == b"content-type":
            return b"json" in value.lower()
    return False


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
