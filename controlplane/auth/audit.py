"""Pure ASGI middleware that audits every mutating API call.

It writes after the response status is known, in its own transaction, so a
refused or failed call is audited too (its own transaction was rolled back).
"""

from __future__ import annotations

from typing import Any

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controlplane.auth import service
from controlplane.db import session_scope
from common.logs import get_logger

log = get_logger(__name__)

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class AuditMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in MUTATING:
            await self.app(scope, receive, send)
            return
        status: dict[str, int] = {}

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            await anyio.to_thread.run_sync(self._write, scope, status.get("code", 500))

    @staticmethod
    def _write(scope: Scope, status_code: int) -> None:
        app: Any = scope["app"]
        state = scope.get("state") or {}
        route = scope.get("route")
        action = getattr(route, "name", None) or f"{scope['method']} unrouted"
        try:
            with session_scope(app.state.session_factory) as session:
                service.record_audit(
                    session,
                    actor=state.get("actor", "anonymous"),
                    action=action,
                    target=scope["path"],
                    outcome="succeeded" if status_code < 400 else "failed",
                    status_code=status_code,
                    clock=app.state.clock,
                )
        except Exception as exc:  # the audit store being down must not hide the reply
            log.error("audit_write_failed", action=action, error=repr(exc))
