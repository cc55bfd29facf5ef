"""Hashing through the API: off the event loop, and holding no database connection.

A registration or verify over the API can hash for minutes. While it
does, the server must keep answering other requests (the hash runs in a
worker thread, never on the event loop) and must not hold a pooled
connection or an open transaction (which on PostgreSQL is an idle-in-
transaction session, and on SQLite a read snapshot that stalls WAL
checkpoints).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.support.controlplane_testing import write_artifact
from weight_catalog import hashing, service, verify

BASE = "/api/v1/catalog/models/llama"


class HeldHash:
    """Wraps hash_shards: records what the server holds, then waits to be let go."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.started = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()
        self.connections_checked_out: int | None = None
        self.real = hashing.hash_shards

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.connections_checked_out = self.client.app.state.engine.pool.checkedout()
        self.started.set()
        self.release.wait(timeout=10)
        try:
            return self.real(*args, **kwargs)
        finally:
            self.finished.set()


def _while_hashing(client: TestClient, monkeypatch: pytest.MonkeyPatch, call: Callable[[], Any],
                   viewer: dict[str, str]) -> tuple[Any, HeldHash]:
    held = HeldHash(client)
    monkeypatch.setattr(service, "hash_shards", held)
    monkeypatch.setattr(verify, "hash_shards", held)
    outcome: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: outcome.setdefault("response", call()))
    worker.start()
    try:
        assert held.started.wait(timeout=10)
        # Answered while the hash is still waiting: the event loop is free,
        # and a database-backed read finds a connection.
        assert client.get("/healthz/live").status_code == 200
        assert client.get("/api/v1/catalog/versions", headers=viewer).status_code == 200
        assert not held.finished.is_set()
    finally:
        held.release.set()
        worker.join(timeout=30)
    assert not worker.is_alive()
    return outcome["response"], held


def test_register_hashes_off_the_event_loop_and_holds_no_connection(
    client: TestClient, as_role: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = write_artifact(tmp_path / "v1", shards=3, shard_bytes=20_000)
    op = as_role("operator")
    response, held = _while_hashing(
        client, monkeypatch,
        lambda: client.post(f"{BASE}/versions", json={"version": "v1", "location": str(root)}, headers=op),
        as_role("viewer"),
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert (body["model"], body["version"], len(body["shards"])) == ("llama", "v1", 7)
    assert held.connections_checked_out == 0


def test_verify_hashes_off_the_event_loop_and_holds_no_connection(
    client: TestClient, as_role: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = write_artifact(tmp_path / "v1", shards=2, shard_bytes=20_000)
    op = as_role("operator")
    assert client.post(f"{BASE}/versions", json={"version": "v1", "location": str(root)}, headers=op).status_code == 201
    response, held = _while_hashing(
        client, monkeypatch, lambda: client.post(f"{BASE}/versions/v1/verify", json={}, headers=op),
        as_role("viewer"),
    )
    assert response.status_code == 200, response.text
    assert (response.json()["healthy"], response.json()["checked"]) == (True, 6)
    assert held.connections_checked_out == 0


def test_register_refuses_a_duplicate_before_hashing(
    client: TestClient, as_role: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = write_artifact(tmp_path / "v1")
    op = as_role("operator")
    assert client.post(f"{BASE}/versions", json={"version": "v1", "location": str(root)}, headers=op).status_code == 201
    calls: list[Any] = []
    monkeypatch.setattr(service, "hash_shards", lambda *a, **k: calls.append(a))
    again = client.post(f"{BASE}/versions", json={"version": "v1", "location": str(root)}, headers=op)
    assert (again.status_code, again.json()["error"]["type"]) == (409, "version_exists")
    assert calls == []
