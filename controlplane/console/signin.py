"""Sign-in and sign-out, the console's home redirect, and its vendored static files.

Sign-in exchanges an API token for the session cookie `session.py` describes
(double-submit CSRF on the form, since no session exists yet); machine tokens
(gateway, agent) are refused. Sign-out is a POST behind the session's CSRF
token. Static files are a fixed table, never a path taken from the URL.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, Response

from controlplane.auth import service as auth_service
from controlplane.auth.roles import MACHINES, Role
from controlplane.console import session as console_session
from controlplane.console.web import (
    Form,
    current_user,
    guard_action,
    key,
    problem,
    redirect,
    refuse_too_large,
    render,
)

router = APIRouter()

STATIC = Path(__file__).parent / "static"
STATIC_FILES = {
    "htmx.min.js": ("htmx-2.0.11.min.js", "text/javascript"),
    "htmx.LICENSE.txt": ("htmx.LICENSE.txt", "text/plain"),
    "console.js": ("console.js", "text/javascript"),
    "console.css": ("console.css", "text/css"),
}
PRESESSION_MAX_AGE_S = 3600


@router.get("/console/static/{name}", include_in_schema=False, name="console.static")
def static_file(name: str) -> Response:
    found = STATIC_FILES.get(name)
    if found is None:
        return Response("not found", status_code=404, media_type="text/plain")
    filename, media_type = found
    return FileResponse(STATIC / filename, media_type=media_type,
                        headers={"Cache-Control": "max-age=3600", "X-Content-Type-Options": "nosniff"})


def _safe_next(target: str | None) -> str:
    # Only our own pages: no scheme, no host, no `//evil` (an open redirect after sign-in).
    if target and target.startswith("/console") and not target.startswith("//") and "\\" not in target:
        return target
    return "/console/fleet"


def _set_cookie(request: Request, response: Response, name: str, value: str, *, max_age: int) -> None:
    response.set_cookie(name, value, max_age=max_age, path=console_session.COOKIE_PATH, httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")


def _sign_in_page(request: Request, *, target: str, status_code: int = 200, error: str | None = None) -> Response:
    presession = secrets.token_urlsafe(24)
    response = render(request, "sign_in.jinja", user=None, next=target, signin_csrf=presession,
                      status_code=status_code, error=error)
    _set_cookie(request, response, console_session.PRESESSION_COOKIE, presession, max_age=PRESESSION_MAX_AGE_S)
    return response


@router.get("/console", include_in_schema=False, name="console.home")
def home(request: Request) -> Response:
    return redirect("/console/fleet" if current_user(request) else "/console/sign-in")


@router.get("/console/sign-in", include_in_schema=False, name="console.sign_in_form")
def sign_in_form(request: Request, next: str | None = None) -> Response:  # noqa: A002 - the query's name
    return _sign_in_page(request, target=_safe_next(next))


@router.post("/console/sign-in", include_in_schema=False, name="console.sign_in")
def sign_in(request: Request, form: Form) -> Response:
    """Exchange an API token for a session cookie. Double-submit CSRF: the form's value must match its cookie."""
    too_large = refuse_too_large(request, form, None)
    if too_large is not None:
        return too_large
    presession = request.cookies.get(console_session.PRESESSION_COOKIE)
    target = _safe_next(form.get("next"))
    submitted = form.get("signin_csrf", "").encode()  # bytes: compare_digest refuses non-ASCII str with TypeError
    if not presession or not secrets.compare_digest(presession.encode(), submitted):
        return problem(request, user=None, status_code=403, error_type="csrf_failed",
                       message="The sign-in form expired or was not sent from this console. Reload and try again.",
                       back="/console/sign-in")
    with request.app.state.read_session_factory() as session:
        token = auth_service.authenticate(session, secret=form.get("token", "").strip())
    if token is None or Role(token.role) in MACHINES:
        return _sign_in_page(request, target=target, status_code=401,
                             error="That token is unknown or revoked (machine tokens — gateway, agent — cannot sign in).")
    request.state.actor = f"token:{token.name}#{token.id}"
    clock = request.app.state.clock
    value, expires_at = console_session.issue(key(request), token, now=clock.wall())
    response = redirect(target)
    _set_cookie(request, response, console_session.SESSION_COOKIE, value, max_age=int(expires_at - clock.wall()))
    response.delete_cookie(console_session.PRESESSION_COOKIE, path=console_session.COOKIE_PATH)
    return response


@router.post("/console/sign-out", include_in_schema=False, name="console.sign_out")
def sign_out(request: Request, form: Form) -> Response:
    checked = guard_action(request, form, Role.VIEWER)
    if not isinstance(checked, console_session.ConsoleUser):
        return checked
    response = redirect("/console/sign-in")
    response.delete_cookie(console_session.SESSION_COOKIE, path=console_session.COOKIE_PATH,
                           httponly=True, samesite="strict", secure=request.url.scheme == "https")
    return response
