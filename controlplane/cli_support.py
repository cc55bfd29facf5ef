"""What every control-plane command shares: settings, the database, and audited units of work.

Used by the root's `lifeline controlplane …` commands and by domain
commands (`lifeline catalog …`), so no domain imports the root's CLI.
SQLAlchemy and the services are imported inside the functions, so
mounting a command tree costs `lifeline engine serve` nothing.

Every mutation runs inside `audited_command`: whatever ends it — a typed
error, a bad argument, an unreadable artifact, a database that is down —
is written to the audit trail as `failed` (best effort: with the database
down the row cannot be written, and the command says so), printed as one
line `error: <type>: <message>` on stderr, and exits non-zero. No
traceback reaches the operator.
"""

from __future__ import annotations

import getpass
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from common.clock import Clock
    from controlplane.config import ControlPlaneSettings

T = TypeVar("T")

# Set while an audited command runs, so a nested one does not audit a failure twice.
_AUDITING: ContextVar[bool] = ContextVar("lifeline_cli_auditing", default=False)


def load_settings(**overrides: Any) -> ControlPlaneSettings:
    from pydantic import ValidationError

    from controlplane.config import ControlPlaneSettings

    try:
        return ControlPlaneSettings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        typer.echo(f"error: bad configuration:\n{exc}", err=True)
        raise typer.Exit(2) from exc


def cli_actor() -> str:
    return f"cli:{getpass.getuser()}"


def fail(error_type: str, message: str, *, code: int = 1) -> NoReturn:
    typer.echo(f"error: {error_type}: {message}", err=True)
    raise typer.Exit(code)


@contextmanager
def cli_database(settings: ControlPlaneSettings, *, read_only: bool = False) -> Iterator[Any]:
    from controlplane.db import build_engine, build_session_factory

    engine = build_engine(settings.resolved_database_url(), timeouts=settings.database_timeouts())
    try:
        yield build_session_factory(engine, read_only=read_only)
    finally:
        engine.dispose()


def _record(settings: ControlPlaneSettings, *, action: str, target: str, status_code: int | None) -> None:
    from common.clock import SystemClock
    from controlplane.auth.service import record_audit
    from controlplane.db import session_scope

    try:
        with cli_database(settings) as factory, session_scope(factory) as session:
            record_audit(session, actor=cli_actor(), action=action, target=target, outcome="failed",
                         status_code=status_code, clock=SystemClock())
    except Exception as exc:  # noqa: BLE001 - the database being down is the likeliest cause of the failure
        typer.echo(f"warning: the failure could not be audited: {type(exc).__name__}", err=True)


@contextmanager
def audited_command(settings: ControlPlaneSettings, *, action: str, target: str) -> Iterator[None]:
    """Audit and report any failure of the block; see the module docstring."""
    from sqlalchemy.exc import SQLAlchemyError

    from common.errors import LifelineError

    if _AUDITING.get():
        yield
        return
    token = _AUDITING.set(True)
    try:
        yield
    except typer.Exit as exc:  # a refused argument, already printed
        if exc.exit_code:
            _record(settings, action=action, target=target, status_code=422 if exc.exit_code == 2 else None)
        raise
    except LifelineError as exc:
        _record(settings, action=action, target=target, status_code=exc.status_code)
        fail(exc.error_type, exc.message)
    except SQLAlchemyError as exc:
        from controlplane.errors import aborted_by_database

        if aborted_by_database(exc):  # the database is up: it broke a lock cycle (controlplane.errors)
            _record(settings, action=action, target=target, status_code=409)
            fail("transaction_aborted", "a concurrent change made the database abort this one; nothing was "
                                        "changed; retry")
        _record(settings, action=action, target=target, status_code=503)
        fail("database_unavailable", f"the database could not be used ({type(exc).__name__})")
    finally:
        _AUDITING.reset(token)


def run_mutation(
    settings: ControlPlaneSettings,
    *,
    action: str,
    target: str,
    work: Callable[[Session, Clock], T],
) -> T:
    """One audited unit of work: commit it with a `succeeded` audit row, or audit the failure and exit 1."""
    from common.clock import SystemClock
    from controlplane.auth.service import record_audit
    from controlplane.db import session_scope

    clock = SystemClock()
    with audited_command(settings, action=action, target=target), cli_database(settings) as factory:
        with session_scope(factory) as session:
            result = work(session, clock)
            record_audit(session, actor=cli_actor(), action=action, target=target, outcome="succeeded",
                         status_code=None, clock=clock)
        return result


def read_only(settings: ControlPlaneSettings, work: Callable[[Session], T]) -> T:
    """A read in a DEFERRED transaction; typed and database errors become one line and exit 1."""
    from sqlalchemy.exc import SQLAlchemyError

    from common.errors import LifelineError
    from controlplane.db import session_scope

    try:
        with cli_database(settings, read_only=True) as factory, session_scope(factory) as session:
            return work(session)
    except LifelineError as exc:
        fail(exc.error_type, exc.message)
    except SQLAlchemyError as exc:
        fail("database_unavailable", f"the database could not be used ({type(exc).__name__})")
