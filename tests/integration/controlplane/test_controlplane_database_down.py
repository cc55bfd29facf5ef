"""A database that is down or silent: 503 database_unavailable, never a hang; liveness stays up.

The silent database is a local TCP server that accepts connections and
never sends a byte, the way a wedged PostgreSQL or a black-holed proxy
behaves. Every request is run in a bounded thread, so a regression fails
the test instead of hanging the suite; nothing asserts on elapsed time.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from common.clock import ManualClock
from controlplane.app import create_app
from controlplane.config import ControlPlaneSettings
from controlplane.topology.lease import InMemoryLeaseReader
from lifeline.processes import free_port
from tests.support.answer_contract import AnswerContract
from tests.support.freezing_proxy import FreezingProxy

BEARER = {"Authorization": "Bearer llt_whatever"}


class SilentServer:
    """Accepts every TCP connection and never answers."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self.listener.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def silent_server() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


def app_for(url: str, tmp_path: Path) -> Any:
    settings = ControlPlaneSettings(database_url=url, data_dir=tmp_path, database_connect_timeout=timedelta(seconds=1),
                                    database_pool_timeout=timedelta(seconds=1))
    return create_app(settings, clock=ManualClock(), lease_reader=InMemoryLeaseReader())


def bounded(call: Any, limit_s: float = 60.0) -> Any:
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), "the request hung"
    return result[0]


def assert_database_unavailable(response: Any) -> None:
    assert response.status_code == 503, response.text
    assert response.json()["error"]["type"] == "database_unavailable"
    assert response.headers["Retry-After"] == "1"


@pytest.mark.parametrize("state", ["down", "silent"])
def test_requests_get_503_database_unavailable_when_the_database_is_down_or_silent(
    tmp_path: Path, silent_server: SilentServer, state: str, answer_contract: AnswerContract
) -> None:
    port = silent_server.port if state == "silent" else free_port()
    app = app_for(f"postgresql://postgres@127.0.0.1:{port}/nothing", tmp_path)
    with answer_contract.watch(TestClient(app, raise_server_exceptions=False)) as client:
        for method, path in [("GET", "/api/v1/regions"), ("POST", "/api/v1/regions"), ("GET", "/api/v1/snapshot")]:
            response = bounded(lambda m=method, p=path: client.request(m, p, headers=BEARER, json={"name": "eu"}))
            assert_database_unavailable(response)
        assert_database_unavailable(bounded(lambda: client.get("/healthz/ready")))
        assert bounded(lambda: client.get("/healthz/live")).json() == {"status": "ok"}


def test_liveness_answers_while_every_worker_thread_waits_on_a_silent_database(
    tmp_path: Path, silent_server: SilentServer, answer_contract: AnswerContract
) -> None:
    app = app_for(f"postgresql://postgres@127.0.0.1:{silent_server.port}/nothing", tmp_path)
    with answer_contract.watch(TestClient(app, raise_server_exceptions=False)) as client:
        stuck = [threading.Thread(target=client.get, args=("/api/v1/regions",), kwargs={"headers": BEARER},
                                  daemon=True) for _ in range(60)]  # more than the 40 worker threads
        for thread in stuck:
            thread.start()
        try:
            assert bounded(lambda: client.get("/healthz/live")).status_code == 200
        finally:
            for thread in stuck:
                thread.join(60)


def test_readiness_is_ok_when_the_database_answers(client: TestClient) -> None:
    assert client.get("/healthz/ready").json() == {"status": "ready"}
    assert client.get("/healthz/live").json() == {"status": "ok"}


def test_cli_says_database_unavailable_without_a_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from lifeline.cli import app

    monkeypatch.setenv("LIFELINE_CONTROLPLANE_DATABASE_URL", f"postgresql://postgres@127.0.0.1:{free_port()}/nothing")
    for args in (["controlplane", "token", "list"], ["controlplane", "token", "revoke", "1"],
                 ["catalog", "promote", "llama", "prod", "v1"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 1, result.output
        assert "error: database_unavailable:" in result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.parametrize("state", ["down", "silent"])
def test_a_lease_registry_that_is_down_or_silent_is_a_typed_503_not_an_empty_region(
    database_url: str, session_factory: Any, tokens: dict[str, str], tmp_path: Path, silent_server: SilentServer,
    state: str, answer_contract: AnswerContract
) -> None:
    port = silent_server.port if state == "silent" else free_port()
    settings = ControlPlaneSettings(database_url=database_url, data_dir=tmp_path,
                                    lease_redis_url=f"redis://127.0.0.1:{port}/0")
    app = create_app(settings, clock=ManualClock())
    with answer_contract.watch(TestClient(app, raise_server_exceptions=False)) as client:
        op = {"Authorization": f"Bearer {tokens['operator']}"}
        assert client.post("/api/v1/regions", json={"name": "eu"}, headers=op).status_code == 201
        for method, path in [("GET", "/api/v1/regions/eu/instances"), ("DELETE", "/api/v1/regions/eu?reason=gone")]:
            response = bounded(lambda m=method, p=path: client.request(m, p, headers=op))
            assert (response.status_code, response.json()["error"]["type"]) == (503, "lease_registry_unavailable")
        assert client.get("/api/v1/regions/eu", headers=op).status_code == 200  # the delete changed nothing


def test_a_sqlite_write_lock_held_past_the_busy_timeout_is_503_not_500(
    tmp_path: Path, answer_contract: AnswerContract
) -> None:
    import sqlite3

    from controlplane.schema import upgrade

    url = f"sqlite:///{tmp_path / 'cp.sqlite3'}"
    upgrade(url)
    settings = ControlPlaneSettings(database_url=url, data_dir=tmp_path,
                                    database_statement_timeout=timedelta(milliseconds=200))
    holder = sqlite3.connect(tmp_path / "cp.sqlite3", isolation_level=None)
    app = create_app(settings, clock=ManualClock())
    with answer_contract.watch(TestClient(app, raise_server_exceptions=False)) as client:
        from controlplane.auth import service
        from controlplane.auth.roles import Role
        from controlplane.db import session_scope

        with session_scope(client.app.state.session_factory) as session:
            _, secret = service.create_token(session, name="op", role=Role.OPERATOR, created_by="t", clock=ManualClock())
        holder.execute("BEGIN IMMEDIATE")
        try:
            response = client.post("/api/v1/regions", json={"name": "eu"}, headers={"Authorization": f"Bearer {secret}"})
            assert_database_unavailable(response)
        finally:
            holder.execute("ROLLBACK")
            holder.close()


def test_an_established_connection_to_a_server_gone_silent_is_cut_off_and_answered_503(
    tmp_path: Path, answer_contract: AnswerContract
) -> None:
    """PostgreSQL only: SQLite has no server to fall silent."""
    from controlplane.auth import service
    from controlplane.auth.roles import Role
    from controlplane.db import session_scope
    from controlplane.schema import upgrade
    from tests.support.controlplane_testing import throwaway_database

    with throwaway_database("postgresql", tmp_path) as real_url:
        upgrade(real_url)
        host_port = real_url.split("@", 1)[1].split("/", 1)[0]
        proxy = FreezingProxy(int(host_port.rsplit(":", 1)[1]))
        try:
            url = real_url.replace(host_port, f"127.0.0.1:{proxy.port}")
            settings = ControlPlaneSettings(database_url=url, data_dir=tmp_path,
                                            database_connect_timeout=timedelta(seconds=2),
                                            database_statement_timeout=timedelta(seconds=1))
            app = create_app(settings, clock=ManualClock(), lease_reader=InMemoryLeaseReader())
            with answer_contract.watch(TestClient(app, raise_server_exceptions=False)) as client:
                with session_scope(app.state.session_factory) as session:
                    _, secret = service.create_token(session, name="v", role=Role.VIEWER, created_by="t",
                                                     clock=ManualClock())
                viewer = {"Authorization": f"Bearer {secret}"}
                assert client.get("/api/v1/regions", headers=viewer).status_code == 200  # pooled connections exist
                proxy.freeze()
                for _ in range(3):
                    assert_database_unavailable(bounded(lambda: client.get("/api/v1/regions", headers=viewer)))
                assert bounded(lambda: client.get("/healthz/ready")).status_code == 503
                assert app.state.engine.dialect is not None
                proxy.thaw()
                recovered = bounded(lambda: client.get("/api/v1/regions", headers=viewer))
                assert recovered.status_code == 200, recovered.text
            app.state.engine.dispose()
        finally:
            proxy.close()
