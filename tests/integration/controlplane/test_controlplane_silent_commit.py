"""A PostgreSQL that falls silent at the COMMIT (or the ROLLBACK that ends a read) is a 503 too, never a hang.

The statement deadline (`controlplane/statement_deadline.py`) guarded every
cursor execute and the checkout ping, but a transaction ends with the
driver's own `commit()`/`rollback()`, which no SQLAlchemy cursor event
sees: a server that stopped answering at that moment held the request's
worker thread for as long as it stayed silent. Here a TCP proxy freezes the
moment it sees the client send `COMMIT` (or `ROLLBACK`), the way a
SIGSTOPped server still ACKs but answers nothing; calls run in bounded
threads, so a regression fails instead of hanging the suite. The engine is
the one `build_engine` makes for the API, whose handler renders the
driver's OperationalError as 503 `database_unavailable`
(test_controlplane_database_down.py).

A COMMIT the server received may still apply when it wakes (it was in its
socket buffer), after the client was told 503: the test accepts either
outcome, but only a consistent one — the region and its one create event,
or neither — and the API must answer again once the server does.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from common.clock import ManualClock
from controlplane.db import DatabaseTimeouts, build_engine, build_session_factory, session_scope
from controlplane.event.models import Event
from controlplane.schema import upgrade
from controlplane.topology import service as topology
from tests.support.controlplane_testing import throwaway_database
from tests.support.freezing_proxy import FreezingProxy


def bounded(call: Any, limit_s: float = 60.0) -> Any:
    """`call()`'s result, or the exception it raised; an AssertionError if it is still running after `limit_s`."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(call())
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            result.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), "the call hung"
    return result[0]


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[Any, FreezingProxy]]:
    """An engine built the way the control plane builds it (1 s statement timeout), through the proxy."""
    with throwaway_database("postgresql", tmp_path) as real_url:
        upgrade(real_url)
        host_port = real_url.split("@", 1)[1].split("/", 1)[0]
        proxy = FreezingProxy(int(host_port.rsplit(":", 1)[1]))
        engine = build_engine(real_url.replace(host_port, f"127.0.0.1:{proxy.port}"),
                              timeouts=DatabaseTimeouts(connect=timedelta(seconds=2),
                                                        statement=timedelta(seconds=1)))
        try:
            yield engine, proxy
        finally:
            proxy.thaw()
            engine.dispose()
            proxy.close()


def create_region(factory: Any, name: str) -> None:
    with session_scope(factory) as session:
        topology.create_region(session, name=name, description="", actor="test", clock=ManualClock())


def region_names(factory: Any) -> list[str]:
    with factory() as session:
        return [r.name for r in topology.list_regions(session)]


def test_a_server_silent_at_the_commit_is_a_database_error_and_the_outcome_is_consistent(proxied: Any) -> None:
    engine, proxy = proxied
    factory = build_session_factory(engine)
    assert region_names(factory) == []  # a pooled connection exists
    proxy.freeze_on = b"COMMIT"
    outcome = bounded(lambda: create_region(factory, "eu"))
    assert proxy.frozen  # the freeze hit the COMMIT, not an earlier statement
    assert isinstance(outcome, OperationalError), outcome  # the API renders it 503 database_unavailable
    proxy.thaw()

    names = bounded(lambda: region_names(factory))
    assert names in ([], ["eu"])  # a COMMIT the server had received may apply when it wakes
    with factory() as session:
        events = [e.kind for e in session.scalars(select(Event))]
    assert events == (["topology.region.create"] if names else [])
    retry = bounded(lambda: create_region(factory, "eu"))
    assert (type(retry).__name__ == "TopologyExists") if names else retry is None, retry


def test_a_server_silent_at_the_rollback_ending_a_read_gives_the_connection_up(proxied: Any) -> None:
    engine, proxy = proxied
    factory = build_session_factory(engine)
    assert region_names(factory) == []
    proxy.freeze_on = b"ROLLBACK"
    bounded(lambda: region_names(factory))  # the pool's reset: an error there discards the connection
    assert proxy.frozen
    proxy.thaw()
    assert bounded(lambda: region_names(factory)) == []
