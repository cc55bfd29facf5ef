"""A client-side deadline for every PostgreSQL round trip, for a server that stops answering.

`statement_timeout` is the server's own limit, and libpq's `connect_timeout`
covers only new connections. A server that is alive to TCP but says
nothing — SIGSTOPped, wedged, or behind a proxy that froze — ACKs every
packet, so keepalives never fire either, and a query or the pool's ping on
an established connection would wait for ever, one worker thread each,
until the process stops answering anything but `/healthz/live`.

One watchdog thread per engine holds a deadline per statement in flight
(`statement_timeout` plus a grace, so the server's own timeout answers
first when it can). When one passes, it shuts the connection's socket
down; libpq's blocked read returns at once with "server closed the
connection", SQLAlchemy invalidates the connection, and the request is
answered 503 `database_unavailable`. The pool's liveness ping runs the same
way, in the `checkout` event (SQLAlchemy's documented pessimistic-disconnect
recipe raising `DisconnectionError`), replacing `pool_pre_ping`, whose ping
no event can guard. A transaction ends with the driver's own `commit()` or
`rollback()` (the pool's reset on return too), which no cursor event sees:
a server silent at that moment held the worker thread for as long as it
stayed silent. SQLAlchemy has no event around them, so `install` wraps the
dialect's `do_commit` and `do_rollback` with the same deadline. Rejected: a `threading.Timer` per statement (a thread
per query) and cancelling the query (`PQcancel` opens another connection to
the same silent server).
"""

from __future__ import annotations

import heapq
import itertools
import os
import socket
import threading
import time
from typing import Any

from sqlalchemy import event, exc
from sqlalchemy.engine import Engine


class SocketWatchdog:
    """Shuts down sockets whose deadline passed; `arm` returns a key for `disarm`."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []
        self._armed: dict[int, int] = {}  # key → socket fd
        self._keys = itertools.count()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self.fired = 0

    def arm(self, fd: int, seconds: float) -> int:
        key = next(self._keys)
        with self._cv:
            self._armed[key] = fd
            heapq.heappush(self._heap, (time.monotonic() + seconds, key))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="db-statement-deadline", daemon=True)
                self._thread.start()
            self._cv.notify()
        return key

    def disarm(self, key: int) -> None:
        with self._cv:
            self._armed.pop(key, None)

    def _run(self) -> None:
        with self._cv:
            while True:
                while self._heap and self._heap[0][1] not in self._armed:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cv.wait()
                    continue
                deadline, key = self._heap[0]
                wait = deadline - time.monotonic()
                if wait > 0:
                    self._cv.wait(wait)
                    continue
                heapq.heappop(self._heap)
                fd = self._armed.pop(key)
                self.fired += 1
                _shutdown(fd)


def _shutdown(fd: int) -> None:
    try:
        duplicate = socket.socket(fileno=os.dup(fd))
    except OSError:
        return  # already closed: the statement ended as the deadline passed
    try:
        duplicate.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        duplicate.close()


def _fd(dbapi_connection: Any) -> int | None:
    try:
        return int(dbapi_connection.pgconn.socket)
    except Exception:  # noqa: BLE001 - closed or not psycopg: nothing to guard
        return None


def install(engine: Engine, *, statement_s: float, ping_s: float) -> SocketWatchdog:
    """Guard every statement of `engine` (a psycopg engine) and ping connections on checkout."""
    watchdog = SocketWatchdog()
    key_name = "lifeline_statement_deadline"

    @event.listens_for(engine, "before_cursor_execute")
    def _arm(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        fd = _fd(conn.connection.dbapi_connection)
        if fd is not None:
            conn.info[key_name] = watchdog.arm(fd, statement_s)

    def _disarm(conn: Any) -> None:
        key = conn.info.pop(key_name, None)
        if key is not None:
            watchdog.disarm(key)

    @event.listens_for(engine, "after_cursor_execute")
    def _after(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        _disarm(conn)

    @event.listens_for(engine, "handle_error")
    def _error(context: Any) -> None:
        if context.connection is not None:
            _disarm(context.connection)

    dialect = engine.dialect
    for name in ("do_commit", "do_rollback"):
        setattr(dialect, name, _guarded(getattr(dialect, name), watchdog, statement_s))

    @event.listens_for(engine.pool, "checkout")
    def _ping(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        fd = _fd(dbapi_connection)
        key = watchdog.arm(fd, ping_s) if fd is not None else None
        try:
            with dbapi_connection.cursor() as cursor:
                cursor.execute("SELECT 1")
            if dbapi_connection.info.transaction_status != 0:  # psycopg: leave no transaction open
                dbapi_connection.rollback()
        except Exception as error:  # noqa: BLE001 - any failure: a dead connection; the pool connects anew
            raise exc.DisconnectionError(f"connection failed its ping: {error!r}") from error
        finally:
            if key is not None:
                watchdog.disarm(key)

    return watchdog


def _guarded(end_transaction: Any, watchdog: SocketWatchdog, seconds: float) -> Any:
    """`end_transaction` (a dialect's do_commit / do_rollback) under a deadline on the connection's socket."""

    def guarded(dbapi_connection: Any) -> None:
        fd = _fd(dbapi_connection)
        key = watchdog.arm(fd, seconds) if fd is not None else None
        try:
            end_transaction(dbapi_connection)
        finally:
            if key is not None:
                watchdog.disarm(key)

    return guarded
