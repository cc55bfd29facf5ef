"""Console sign-in: an API token exchanged for a signed session cookie, and CSRF tokens bound to it.

The cookie holds no secret: `<token id>.<expires at>.<nonce>.<mac>`, where
the MAC is HMAC-SHA256 under a key that mixes this process's console key
with the token's stored sha256. So a session

- dies with its token: every request looks the token up afresh by id, and a
  revoked token (or one whose row changed) no longer authenticates;
- expires at a time it carries and the server checks against its clock
  (`SESSION_TTL`, 8 h; no sliding renewal, so a stolen cookie has a bound);
- cannot be forged from a database dump alone (the process key is not in it).

The process key is random per process unless the composition root sets
`app.state.console_session_key` (bytes): a restart signs everyone out, and
several processes behind one address need the same key. Rejected: a
server-side session table (a migration for state the token row already
holds) and the token itself in the cookie (a bearer secret in every request
a browser makes).

CSRF: every form carries `csrf_token` = HMAC(key, "csrf." + nonce) of the
session it was rendered for; the sign-in form, before any session exists,
uses a double-submit cookie. The cookie is SameSite=Strict as well, which
alone stops cross-site posts in current browsers; the token covers the rest.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session

from controlplane.auth.models import ApiToken
from controlplane.auth.roles import MACHINES, Role

SESSION_COOKIE = "lifeline_console"
PRESESSION_COOKIE = "lifeline_console_signin"
SESSION_TTL = timedelta(hours=8)
COOKIE_PATH = "/console"


@dataclass(frozen=True)
class ConsoleUser:
    """Who is signed in: the same actor string and role as a bearer request with that token."""

    actor: str
    role: Role
    token_id: int
    nonce: str
    expires_at: float

    def may(self, required: Role) -> bool:
        return self.role.allows(required)


def process_key(app_state: Any) -> bytes:
    key = getattr(app_state, "console_session_key", None)
    if key is None:
        key = secrets.token_bytes(32)
        app_state.console_session_key = key
    return bytes(key)


def _mac(key: bytes, token: ApiToken, message: str) -> str:
    per_token = hmac.new(key, token.token_sha256.encode(), hashlib.sha256).digest()
    return hmac.new(per_token, message.encode(), hashlib.sha256).hexdigest()


def issue(key: bytes, token: ApiToken, *, now: float) -> tuple[str, float]:
    """A cookie value for `token`, and when it expires (epoch seconds)."""
    expires_at = int(now + SESSION_TTL.total_seconds())
    payload = f"{token.id}.{expires_at}.{secrets.token_urlsafe(16)}"
    return f"{payload}.{_mac(key, token, payload)}", float(expires_at)


def resolve(session: Session, key: bytes, cookie: str | None, *, now: float) -> ConsoleUser | None:
    """The signed-in user for a cookie value, or None (absent, malformed, forged, expired or revoked)."""
    if not cookie:
        return None
    parts = cookie.split(".")
    # ASCII digits only: str.isdigit() admits "²", which int() then refuses.
    if len(parts) != 4 or not all(p.isascii() and p.isdigit() for p in parts[:2]):
        return None
    token_id, expires_at, nonce, mac = int(parts[0]), int(parts[1]), parts[2], parts[3]
    if expires_at <= now or token_id > 2**63 - 1:
        return None
    token = session.get(ApiToken, token_id)
    if token is None or token.revoked_at is not None:
        return None
    if not hmac.compare_digest(mac.encode(), _mac(key, token, f"{token_id}.{expires_at}.{nonce}").encode()):
        return None
    role = Role(token.role)
    if role in MACHINES:  # a machine token (gateway, agent) has no business in a browser
        return None
    return ConsoleUser(actor=f"token:{token.name}#{token.id}", role=role, token_id=token.id, nonce=nonce,
                       expires_at=float(expires_at))


def cookie_actor(scope: Any, app: Any) -> str | None:
    """The actor a valid session cookie names, for the audit of a `/console` call no console code ran for.

    An `AuditMiddleware` identify function (`controlplane.auth.audit`): a
    refused call (an unknown `/console/…` path, a method a page does not
    take) never reaches `current_user`, which sets the actor otherwise.
    Only under `COOKIE_PATH`, where the browser sends the cookie and where
    it is a credential: the API takes bearer tokens only.
    """
    from starlette.requests import cookie_parser

    path = str(scope.get("path", ""))
    if path != COOKIE_PATH and not path.startswith(COOKIE_PATH + "/"):
        return None
    header = b"; ".join(value for name, value in scope.get("headers") or [] if name == b"cookie")
    cookie = cookie_parser(header.decode("latin-1")).get(SESSION_COOKIE) if header else None
    if not cookie:
        return None
    state = app.state
    with state.read_session_factory() as session:
        user = resolve(session, process_key(state), cookie, now=state.clock.wall())
    return user.actor if user is not None else None


def csrf_for(key: bytes, nonce: str) -> str:
    return hmac.new(key, f"csrf.{nonce}".encode(), hashlib.sha256).hexdigest()


def csrf_ok(key: bytes, nonce: str, submitted: str | None) -> bool:
    # As bytes: compare_digest raises TypeError on a str with non-ASCII characters (a hostile form's value).
    return bool(submitted) and hmac.compare_digest(csrf_for(key, nonce).encode(), str(submitted).encode())
