"""Alias moves that cross each other on PostgreSQL: no deadlock, and never a 503 while the database is up.

Two aliases swapping versions (prod v1 → v2 while canary v2 → v1) touched
the same two version rows in opposite orders: each promote locked its
target FOR UPDATE, and the move's history row then needed a key-share lock
on the version the alias left, which the other promote held. PostgreSQL
broke the cycle by aborting one (SQLSTATE 40P01), and the API answered the
abort `503 database_unavailable` with the database up. Each round here
races such crossing moves from threads released by one barrier; every
answer must be a 200 or a typed 409, and the final state a consistent one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.support.controlplane_testing import write_artifact

BASE = "/api/v1/catalog/models/llama"
ALIASES = ("prod", "canary", "shadow", "blue")
ROUNDS = 12


def race(calls: list[Callable[[], Any]]) -> list[Any]:
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(index: int) -> None:
        barrier.wait()
        results[index] = calls[index]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    return results


@pytest.fixture
def versions(client: TestClient, as_role: Any, tmp_path: Path) -> list[str]:
    names = [f"v{i}" for i in range(1, len(ALIASES) + 1)]
    for index, name in enumerate(names, start=1):
        root = write_artifact(tmp_path / name, seed=index)
        response = client.post(f"{BASE}/versions", json={"version": name, "location": str(root)},
                               headers=as_role("operator"))
        assert response.status_code == 201, response.text
    return names


def test_crossing_alias_moves_never_answer_503_and_leave_a_consistent_state(
    client: TestClient, as_role: Any, versions: list[str]
) -> None:
    op = as_role("operator")
    for alias, version in zip(ALIASES, versions, strict=True):
        response = client.post(f"{BASE}/aliases/{alias}/promote", json={"version": version}, headers=op)
        assert response.status_code == 200, response.text
    snapshot_before = client.get("/api/v1/snapshot", headers=as_role("viewer")).json()["version"]
    accepted = 0
    for round_no in range(ROUNDS):
        # Every alias moves to the version its neighbour holds: a ring of crossing locks.
        shift = 1 + round_no % (len(versions) - 1)
        held = {a["name"]: a["version"] for a in client.get(f"{BASE}/aliases", headers=op).json()}
        calls: list[Callable[[], Any]] = []
        for index, alias in enumerate(ALIASES):
            target = held[ALIASES[(index + shift) % len(ALIASES)]]
            calls.append(lambda a=alias, v=target: client.post(
                f"{BASE}/aliases/{a}/promote", json={"version": v, "force": True, "reason": "swap"}, headers=op))
            calls.append(lambda a=alias: client.post(
                f"{BASE}/aliases/{a}/rollback", json={"reason": "undo", "force": True}, headers=op))
        responses = race(calls)
        answers = [(r.status_code, (r.json().get("error") or {}).get("type")) for r in responses]
        assert all(status in (200, 409) for status, _ in answers), [r.text for r in responses]
        assert all(kind in (None, "alias_conflict", "alias_unchanged", "nothing_to_roll_back")
                   for _, kind in answers), answers
        accepted += sum(1 for status, _ in answers if status == 200)

    total_moves = 0
    current = {a["name"]: a for a in client.get(f"{BASE}/aliases", headers=op).json()}
    for alias in ALIASES:
        oldest_first = list(reversed(client.get(f"{BASE}/aliases/{alias}/history", headers=op).json()))
        assert [m["revision"] for m in oldest_first] == list(range(1, len(oldest_first) + 1))
        for previous, move in zip(oldest_first, oldest_first[1:], strict=False):
            assert move["from_version"] == previous["to_version"], (alias, oldest_first)
        assert current[alias]["version"] == oldest_first[-1]["to_version"]
        assert current[alias]["revision"] == len(oldest_first)
        total_moves += len(oldest_first) - 1  # the set-up promote is not a raced one
    assert total_moves == accepted
    events = client.get("/api/v1/events", params={"kind": "alias.promote", "limit": 1000}, headers=op).json()
    events += client.get("/api/v1/events", params={"kind": "alias.rollback", "limit": 1000}, headers=op).json()
    assert len(events) == accepted + len(ALIASES)
    assert client.get("/api/v1/snapshot", headers=as_role("viewer")).json()["version"] == snapshot_before + accepted
