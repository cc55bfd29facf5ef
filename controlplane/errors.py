"""One error tree, one renderer.

    LifelineError (500 internal_error)
    ├── NotFound            404  <thing>_not_found
    ├── Conflict            409  <reason>
    ├── InvalidInput        422  invalid_request / <reason>
    ├── Unauthenticated     401  unauthenticated
    └── Forbidden           403  forbidden

Services raise these; they never raise HTTPException. `install_error_handlers`
renders every error, including FastAPI's own validation errors and database
constraint races, in the one shape of `common.errors`:
`{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from common.errors import LifelineError, error_body
from common.logs import get_logger

log = get_logger(__name__)


class NotFound(LifelineError):
    status_code = 404
    error_type = "not_found"


class Conflict(LifelineError):
    status_code = 409
    error_type = "conflict"


class InvalidInput(LifelineError):
    status_code = 422
    error_type = "invalid_request"


class Unauthenticated(LifelineError):
    status_code = 401
    error_type = "unauthenticated"


class Forbidden(LifelineError):
    status_code = 403
    error_type = "forbidden"


def _render(status: int, type_: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(type_, message, code=status), status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    from sqlalchemy.exc import DataError, IntegrityError

    @app.exception_handler(LifelineError)
    async def _lifeline(_: Request, exc: LifelineError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        return JSONResponse(exc.body(), status_code=exc.status_code, headers={**exc.headers(), **(headers or {})})

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for err in exc.errors()[:5]:
            where = ".".join(str(p) for p in err.get("loc", ()))
            parts.append(f"{where}: {err.get('msg', 'invalid')}")
        return _render(422, "invalid_request", "; ".join(parts) or "invalid request")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        type_ = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _render(exc.status_code, type_, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(IntegrityError)
    async def _integrity(_: Request, exc: IntegrityError) -> JSONResponse:
        # Two writers raced past a pre-check; the constraint decided.
        log.info("integrity_conflict", error=str(exc.orig))
        return _render(409, "conflict", "the change conflicts with existing state; retry")

    @app.exception_handler(DataError)
    async def _data(_: Request, exc: DataError) -> JSONResponse:
        # A value the database cannot store (NUL byte, out-of-range integer).
        return _render(422, "invalid_request", "a value is out of range for storage")

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled_error", error=repr(exc))
        return _render(500, "internal_error", "internal error")
