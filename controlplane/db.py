"""Database engine, sessions and schema migrations.

One `Base` for every domain's tables. This is a shared piece that domains
import, so it imports no domain and not Alembic: the registry of every
table and the migration commands live at the composition root
(`controlplane/schema.py`). Services
never commit: the API commits once at the request boundary (see
`get_db_session`) and the CLI commits once per command.

SQLite transactions are SQLAlchemy's, not pysqlite's. pysqlite emits no
BEGIN before the first SELECT (only before DML), so a read-then-write unit
of work was not one transaction: a SAVEPOINT opened the real transaction
and its RELEASE committed it, and racing first promotes of an alias left a
history whose `from` was not the previous `to`. The fix is the one
SQLAlchemy documents for pysqlite ("Serializable isolation / Savepoints /
Transactional DDL"): switch pysqlite's own transaction handling off on
connect and emit BEGIN from the `begin` event. Units of work that may
write begin with `BEGIN IMMEDIATE`, so two writers queue on SQLite's one
write lock (busy timeout) instead of both reading and the loser failing
with SQLITE_BUSY at its first write, which in WAL mode no wait can cure.
Sessions opened with `read_only=True` begin DEFERRED and never block a
writer. PostgreSQL needs none of this: its transactions begin on the first
statement, and the services compare-and-set.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, Request
from sqlalchemy import JSON, DateTime, MetaData, TypeDecorator, create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """An aware UTC datetime on both backends.

    PostgreSQL's `timestamptz` comes back in the session's time zone and
    SQLite's text comes back naive, so the API rendered `…+00:00` on one and
    no offset at all on the other. Values are converted to UTC on the way
    in (naive ones are taken as UTC), stored naive on SQLite so text
    comparisons order correctly, and come back aware in UTC on both.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        # OverflowError for one whose offset carries it past year 1 or 9999 in UTC: a 422 (controlplane.errors)
        value = naive_as_utc(value).astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return naive_as_utc(value).astimezone(UTC)


def naive_as_utc(value: datetime) -> datetime:
    """`value` with UTC as its zone if it has none, as the database takes it; comparable with the clock's."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


# Execution option read by the SQLite `begin` listener: "IMMEDIATE" (default) or "DEFERRED".
SQLITE_BEGIN = "lifeline_sqlite_begin"


@dataclass(frozen=True)
class DatabaseTimeouts:
    """How long a request may wait on the database before it is answered 503 `database_unavailable`.

    connect: TCP connect plus PostgreSQL's start-up exchange (libpq's
    `connect_timeout`, at least 2 s), so a server that accepts and then
    says nothing cannot hold a worker thread for ever. statement:
    PostgreSQL's `statement_timeout` (None: none, for migrations); on
    SQLite the busy timeout, how long a writer queues for the write lock.
    pool: how long a request waits for a pooled connection. Keepalives
    notice a peer that vanished from the network mid-query; a server that
    is alive to TCP but silent on an established connection is cut off by
    `controlplane.statement_deadline` at statement timeout plus a grace.
    """

    connect: timedelta = timedelta(seconds=5)
    statement: timedelta | None = timedelta(seconds=30)
    pool: timedelta = timedelta(seconds=10)


def build_engine(url: str, *, timeouts: DatabaseTimeouts = DatabaseTimeouts()) -> Engine:  # noqa: B008 - frozen
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        busy = timeouts.statement.total_seconds() if timeouts.statement is not None else 30.0
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": busy})

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_connection: Any, _: Any) -> None:
            # pysqlite: no implicit BEGIN/COMMIT of its own; `_sqlite_begin` emits BEGIN.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(connection: Any) -> None:
            mode = connection.get_execution_options().get(SQLITE_BEGIN, "IMMEDIATE")
            connection.exec_driver_sql(f"BEGIN {mode}")

        return engine
    connect_args: dict[str, Any] = {
        "connect_timeout": max(2, round(timeouts.connect.total_seconds())),
        "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 3, "keepalives_count": 3,
    }
    if timeouts.statement is not None:
        connect_args["options"] = f"-c statement_timeout={int(timeouts.statement.total_seconds() * 1000)}"
    # pool_pre_ping's ping cannot be given a deadline; with one, the guarded ping in `checkout` replaces it.
    engine = create_engine(url, pool_pre_ping=timeouts.statement is None, pool_timeout=timeouts.pool.total_seconds(),
                           connect_args=connect_args)
    if timeouts.statement is not None:
        from controlplane import statement_deadline

        # The server's statement_timeout answers first while it can; this is for when it cannot.
        statement_s = timeouts.statement.total_seconds()
        statement_deadline.install(engine, statement_s=statement_s + max(1.0, statement_s * 0.1),
                                   ping_s=max(2.0, timeouts.connect.total_seconds()))
    return engine


def build_session_factory(engine: Engine, *, read_only: bool = False) -> sessionmaker[Session]:
    """Sessions for units of work; `read_only` ones begin DEFERRED on SQLite and never take the write lock."""
    bind = engine.execution_options(**{SQLITE_BEGIN: "DEFERRED"}) if read_only else engine
    return sessionmaker(bind, expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One unit of work outside a request (CLI commands): commit or roll back."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def get_db_session(request: Request) -> Iterator[Session]:
    state = request.app.state
    factory: sessionmaker[Session] = (
        state.read_session_factory if request.method in READ_METHODS else state.session_factory
    )
    with session_scope(factory) as session:
        yield session


# scope="function": commit before the response is sent, so a failed commit
# is the client's error response, not a silent loss after a 2xx.
DbSession = Annotated[Session, Depends(get_db_session, scope="function")]
