"""Pure ASGI middleware: refuse request bodies over a size limit with 413 `request_too_large`.

The control plane's bodies are small (the largest, a gateway report with
thousands of endpoints, is about a megabyte), so a body is read whole
before the app sees it: a declared `Content-Length` over the limit is
refused without reading, and a chunked body is counted as it arrives and
refused at the first byte over. Either way nothing was parsed or written.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from common.errors import error_body


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await self._refuse(send)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send) -> None:
        import json

        body = json.dumps(error_body("request_too_large", f"the request body is over {self.max_bytes} bytes",
                                     code=413)).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
