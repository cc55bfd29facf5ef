"""Pure ASGI middleware that audits every mutating API call.

The row is written when the response status is known and *before* the
response starts: a client that saw the reply can find its row, rows are in
the order the replies went out, and a process that dies after replying has
already recorded it. The write is in its own transaction, so a refused or
failed call is audited too (its own transaction was rolled back).

The actor is the token's even when no route ran (404 on an unknown path,
405 on a method the path does not take): the middleware then asks each of
its `identify` functions in turn who the request's credential names — the
bearer token (`bearer_actor`), and the console's session cookie, which the
composition root adds (`controlplane.console.session.cookie_actor`). With
the bearer token alone, a signed-in console user's refused POST to an
unknown `/console/…` path was audited as `anonymous`. The action is the route's name only when that
route takes the method; otherwise `<METHOD> unrouted`, so a 405 row
names the method and never another route. The target is the raw,
still-percent-encoded path, so a NUL (`%00`) or invalid UTF-8 in a URL
is stored as sent and never breaks the write on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from common.logs import get_logger
from controlplane.auth import service
from controlplane.db import session_scope

log = get_logger(__name__)

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})

# Who a request's credential names when no route set the actor: an actor string, or None for "not this kind".
Identify = Callable[[Scope, Any], "str | None"]


def bearer_actor(scope: Scope, app: Any) -> str | None:
    """The actor of a valid bearer token in `scope`'s headers, as `require` names it; None otherwise."""
    secret = _bearer(scope)
    if secret is None:
        return None
    with app.state.read_session_factory() as session:
        token = service.authenticate(session, secret=secret)
    return f"token:{token.name}#{token.id}" if token is not None else None


class AuditMiddleware:
    def __init__(self, app: ASGIApp, *, identify: Sequence[Identify] = (bearer_actor,)) -> None:
        self.app = app
        self.identify = tuple(identify)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in MUTATING:
            await self.app(scope, receive, send)
            return
        audited = False

        async def send_wrapper(message: Message) -> None:
            nonlocal audited
            if message["type"] == "http.response.start" and not audited:
                audited = True
                await anyio.to_thread.run_sync(self._write, scope, message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            if not audited:  # the app failed before any response started
                await anyio.to_thread.run_sync(self._write, scope, 500)

    @staticmethod
    def _action(scope: Scope) -> str:
        route = scope.get("route")
        methods = getattr(route, "methods", None) or set()
        if route is not None and scope["method"] in methods:
            return str(getattr(route, "name", None) or f"{scope['method']} unrouted")
        return f"{scope['method']} unrouted"

    @staticmethod
    def _target(scope: Scope) -> str:
        raw = scope.get("raw_path")
        if isinstance(raw, bytes):
            return raw.decode("ascii", "backslashreplace")
        return str(scope["path"]).encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace").replace(
            "\x00", "%00")

    def _actor(self, scope: Scope, app: Any) -> str:
        state = scope.get("state") or {}
        if "actor" in state:
            return str(state["actor"])
        for identify in self.identify:
            actor = identify(scope, app)
            if actor is not None:
                return actor
        return "anonymous"

    def _write(self, scope: Scope, status_code: int) -> None:
        app: Any = scope["app"]
        if (scope.get("state") or {}).get("database_unavailable"):
            return  # the request already failed to reach the database; this write would wait and fail too
        action = self._action(scope)
        try:
            actor = self._actor(scope, app)
            with session_scope(app.state.session_factory) as session:
                service.record_audit(
                    session,
                    actor=actor,
                    action=action,
                    target=self._target(scope),
                    outcome="succeeded" if status_code < 400 else "failed",
                    status_code=status_code,
                    clock=app.state.clock,
                )
        except Exception as exc:  # the audit store being down must not hide the reply
            log.error("audit_write_failed", action=action, error=repr(exc))


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers") or []:
        if name == b"authorization":
            scheme, _, secret = value.decode("latin-1").partition(" ")
            return secret.strip() or None if scheme.lower() == "bearer" else None
    return None
