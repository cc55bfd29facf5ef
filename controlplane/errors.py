"""One error tree, one renderer.

    LifelineError (500 internal_error)
    ├── NotFound            404  <thing>_not_found
    ├── Conflict            409  <reason>
    ├── InvalidInput        422  invalid_request / <reason>
    ├── Unauthenticated     401  unauthenticated
    ├── Forbidden           403  forbidden
    ├── DatabaseUnavailable 503  database_unavailable
    └── TransactionAborted  409  transaction_aborted

Framework errors get types too: an unknown path 404 `not_found`, a
method the path does not take 405 `method_not_allowed`, any other HTTP
error `http_error`, a body or parameter that fails validation 422
`invalid_request`, a constraint race 409 `conflict`, a database that is
down, silent (past its timeouts) or locked 503 `database_unavailable`
with `Retry-After`. A transaction the database itself aborted to break a
deadlock or a serialization failure (SQLSTATE 40P01, 40001) is 409
`transaction_aborted`: the database is up, the change was not made, and a
retry can succeed. It used to be a 503 like a database that is away,
which sent operators looking for an outage that was a lock cycle.

Services raise these; they never raise HTTPException. `install_error_handlers`
renders every error, including FastAPI's own validation errors and database
constraint races, in the one shape of `common.errors`:
`{"error": {"message", "type", "param", "code"}}`. A value the driver
cannot bind (a timestamp past year 9999 in UTC) is a 422 `invalid_request` too.
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


class DatabaseUnavailable(LifelineError):
    """The database refused, timed out or is locked: not the caller's fault; retry later."""

    status_code = 503
    error_type = "database_unavailable"


class TransactionAborted(LifelineError):
    """The database aborted this transaction to let a concurrent one through (deadlock, serialization failure).

    Nothing was changed. Writers take their locks in one order (see
    `weight_catalog.repository.lock_versions`), so this is a bug to report
    when it happens, not a state of the database.
    """

    status_code = 409
    error_type = "transaction_aborted"


# SQLSTATE class 40 codes with which PostgreSQL aborts a transaction that a retry can redo.
ABORTED_BY_DATABASE = frozenset({"40001", "40P01"})


def aborted_by_database(exc: BaseException) -> bool:
    """True when `exc` (a SQLAlchemy DBAPIError) is a deadlock or serialization abort, not an unreachable database."""
    return getattr(getattr(exc, "orig", None), "sqlstate", None) in ABORTED_BY_DATABASE


def _render(status: int, type_: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(type_, message, code=status), status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    from sqlalchemy.exc import DataError, IntegrityError, InterfaceError, OperationalError, StatementError
    from sqlalchemy.exc import TimeoutError as PoolTimeout

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

    @app.exception_handler(StatementError)
    async def _unbindable(_: Request, exc: StatementError) -> JSONResponse:
        # Raised before the database saw the statement. The database's own refusals are
        # DBAPIError subclasses with handlers of their own (more specific, so they win).
        if isinstance(exc.orig, OverflowError):
            # A timestamp whose offset carries it past year 1 or 9999 once in UTC.
            return _render(422, "invalid_request", "a value is out of range for storage")
        log.error("unhandled_error", error=repr(exc))
        return _render(500, "internal_error", "internal error")

    async def _database_down(request: Request, exc: Exception) -> JSONResponse:
        if aborted_by_database(exc):
            log.error("transaction_aborted", error=repr(exc)[:300])  # a lock-order bug: worth a report
            aborted = TransactionAborted("a concurrent change made the database abort this one; nothing was "
                                         "changed; retry")
            return JSONResponse(aborted.body(), status_code=aborted.status_code)
        log.warning("database_unavailable", error=repr(exc)[:300])
        request.state.database_unavailable = True  # the audit middleware skips a write that cannot succeed
        error = DatabaseUnavailable("the database is unavailable; retry shortly", retry_after_s=1)
        return JSONResponse(error.body(), status_code=error.status_code, headers=error.headers())

    for database_error in (OperationalError, InterfaceError, PoolTimeout):
        app.add_exception_handler(database_error, _database_down)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled_error", error=repr(exc))
        return _render(500, "internal_error", "internal error")
