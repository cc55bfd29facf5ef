"""Rendering, form parsing and the guards every console route shares.

Pages are server-rendered Jinja2 with autoescape on for every template
(Starlette's default escapes only `.html`; ours are `.jinja`). Each response
carries a strict Content-Security-Policy: scripts and styles only from
/console/static, no inline script, no framing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import parse_qsl, quote

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from pydantic import BaseModel, ValidationError
from sqlalchemy.orm import Session

from common.errors import LifelineError
from controlplane.auth.roles import Role
from controlplane.console import dashboards
from controlplane.console import session as console_session
from controlplane.console.dashboards import panel_link
from controlplane.console.session import ConsoleUser
from controlplane.db import session_scope
from controlplane.errors import InvalidInput

M = TypeVar("M", bound=BaseModel)

TEMPLATES = Path(__file__).parent / "templates"
MAX_FORM_BYTES = 64 * 1024
# What `read_form` returns for a body over MAX_FORM_BYTES: a name no field can have, checked before anything else.
TOO_LARGE = "\x00too_large"

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _when(value: datetime | float | None) -> str:
    if value is None:
        return "—"
    if isinstance(value, (int, float)):
        value = datetime.fromtimestamp(value, UTC)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _as_json(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, BaseModel):  # a typed record (a cutover step's state): its JSON, as the API renders it
        value = value.model_dump(mode="json")
    return json.dumps(value, sort_keys=True, default=str, indent=1)


def _build_env() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["when"] = _when
    env.filters["as_json"] = _as_json
    env.filters["urlq"] = lambda v: quote(str(v), safe="")
    env.globals["panel_link"] = panel_link
    env.globals["panels"] = dashboards
    return env


ENV = _build_env()


def key(request: Request) -> bytes:
    return console_session.process_key(request.app.state)


def current_user(request: Request) -> ConsoleUser | None:
    """The signed-in user (token looked up afresh), or None. Sets the audit actor as a bearer request would."""
    state = request.app.state
    with state.read_session_factory() as session:
        user = console_session.resolve(session, key(request), request.cookies.get(console_session.SESSION_COOKIE),
                                       now=state.clock.wall())
    if user is not None:
        request.state.actor = user.actor
    return user


def render(request: Request, template: str, *, user: ConsoleUser | None, status_code: int = 200,
           **context: Any) -> HTMLResponse:
    csrf = console_session.csrf_for(key(request), user.nonce) if user is not None else ""
    context.setdefault("section", None)
    context.setdefault("grafana_url", request.app.state.settings.grafana_url)
    body = ENV.get_template(template).render(
        user=user, csrf_token=csrf, path=request.url.path, Role=Role, **context,
    )
    return HTMLResponse(body, status_code=status_code, headers=SECURITY_HEADERS)


def problem(request: Request, *, user: ConsoleUser | None, status_code: int, error_type: str,
            message: str, back: str | None = None) -> HTMLResponse:
    """An error page in the API's vocabulary: the same status and `type` the REST route would answer."""
    return render(request, "error.jinja", user=user, status_code=status_code, error_type=error_type,
                  message=message, back=back)


def to_sign_in(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/console/sign-in?next={quote(target, safe='')}", status_code=303,
                            headers=SECURITY_HEADERS)


def redirect(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303, headers=SECURITY_HEADERS)


async def read_form(request: Request) -> dict[str, str]:
    """An `application/x-www-form-urlencoded` body as a dict (first value wins); bounded in size.

    Parsed here rather than with FastAPI's `Form`, which needs python-multipart
    for what is a single urlencoded line. A body over MAX_FORM_BYTES (declared
    or counted) is not parsed at all: the result is `{TOO_LARGE: ...}`, which
    `refuse_too_large` turns into 413 `request_too_large` before any session,
    CSRF or role check, so the refusal says what was wrong.
    """
    if request.method != "POST":
        return {}
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > MAX_FORM_BYTES:
        return {TOO_LARGE: declared}
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > MAX_FORM_BYTES:
            return {TOO_LARGE: str(len(body))}
    form: dict[str, str] = {}
    for name, value in parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True):
        form.setdefault(name.replace("\x00", ""), value.replace("\x00", ""))
    return form


Form = Annotated[dict[str, str], Depends(read_form)]


def refuse_too_large(request: Request, form: dict[str, str], user: ConsoleUser | None) -> HTMLResponse | None:
    if TOO_LARGE not in form:
        return None
    return problem(request, user=user, status_code=413, error_type="request_too_large",
                   message=f"The form is over {MAX_FORM_BYTES} bytes; nothing was read or changed.")


def guard_action(request: Request, form: dict[str, str], required: Role) -> ConsoleUser | HTMLResponse:
    """Admit a form post only from a signed-in user of `required` role whose CSRF token matches.

    Every refusal is an HTML page with the REST API's status and type, and
    the audit middleware records it (401/403) like a refused API call.
    """
    user = current_user(request)
    too_large = refuse_too_large(request, form, user)
    if too_large is not None:
        return too_large
    if user is None:
        return problem(request, user=None, status_code=401, error_type="unauthenticated",
                       message="Your console session is missing or has expired. Sign in again.")
    if not console_session.csrf_ok(key(request), user.nonce, form.get("csrf_token")):
        return problem(request, user=user, status_code=403, error_type="csrf_failed",
                       message="The form's CSRF token is missing or does not match your session. "
                               "Reload the page and try again.")
    if not user.may(required):
        return problem(request, user=user, status_code=403, error_type="forbidden",
                       message=f"role {user.role} may not do this; it needs {required}")
    return user


@contextmanager
def unit_of_work(request: Request) -> Iterator[Session]:
    """One write transaction, committed on success, rolled back on any error (never half of a refused action)."""
    with session_scope(request.app.state.session_factory) as session:
        yield session


def run_action(request: Request, user: ConsoleUser, action: Callable[[], Response], *,
               back: str) -> Response:
    """Run an action; a typed service error becomes an error page with the API's status and type."""
    try:
        return action()
    except LifelineError as exc:
        response = problem(request, user=user, status_code=exc.status_code, error_type=exc.error_type,
                           message=exc.message, back=back)
        response.headers.update(exc.headers())
        return response


def parse(schema: type[M], data: dict[str, Any]) -> M:
    """Validate a form with the REST route's own request schema, so both refuse the same input (422)."""
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or None
        raise InvalidInput(f"{field or 'form'}: {first['msg']}", param=field) from None


def install_error_pages(app: Any) -> None:
    """Answer errors under /console as the console's typed page, not the API's JSON.

    A request the router refuses before any console code runs (an id past the
    integer range, an unknown path, the database down while a page resolves
    its user) reaches the app's JSON handlers. Each one is wrapped: under
    /console the same status, `type` and message come back as `error.jinja`,
    so a person in a browser reads the refusal. No user is looked up: the
    error may be that the database is unreachable.
    """
    for exc_class, handler in list(app.exception_handlers.items()):
        app.exception_handlers[exc_class] = _as_page(handler)


def _as_page(handler: Callable[[Request, Exception], Any]) -> Callable[[Request, Exception], Any]:
    async def wrapped(request: Request, exc: Exception) -> Response:
        response = await handler(request, exc)
        if not request.url.path.startswith("/console") or response.media_type != "application/json":
            return response
        try:
            error = json.loads(response.body)["error"]
            error_type, message = str(error["type"]), str(error["message"])
        except (ValueError, KeyError, TypeError):
            return response
        page = problem(request, user=None, status_code=response.status_code, error_type=error_type,
                       message=message, back="/console")
        for name in ("retry-after", "allow"):
            if name in response.headers:
                page.headers[name] = response.headers[name]
        return page
    return wrapped
