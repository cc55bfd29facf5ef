"""Racing alias moves and known-issue resolves over the API, on SQLite and PostgreSQL.

Each test fires its calls from threads released together by a barrier, then
checks the invariants a post-mortem relies on: every move's `from` is the
previous move's `to`, revisions go up by one, each accepted change wrote
exactly one event and one snapshot bump, and refused ones wrote nothing.
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
RACERS = 8


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
    names = [f"v{i}" for i in range(1, RACERS + 1)]
    for name in names:
        root = write_artifact(tmp_path / name, seed=int(name[1:]))
        response = client.post(f"{BASE}/versions", json={"version": name, "location": str(root)},
                               headers=as_role("operator"))
        assert response.status_code == 201, response.text
    return names


def snapshot_version(client: TestClient, as_role: Any) -> int:
    return client.get("/api/v1/snapshot", headers=as_role("viewer")).json()["version"]


def assert_history_is_a_chain(client: TestClient, as_role: Any, alias: str) -> list[dict[str, Any]]:
    history = client.get(f"{BASE}/aliases/{alias}/history", headers=as_role("viewer")).json()
    oldest_first = list(reversed(history))
    assert [m["revision"] for m in oldest_first] == list(range(1, len(oldest_first) + 1))
    assert oldest_first[0]["from_version"] is None
    for previous, move in zip(oldest_first, oldest_first[1:], strict=False):
        assert move["from_version"] == previous["to_version"], oldest_first
    current = client.get(f"{BASE}/aliases", headers=as_role("viewer")).json()
    assert {a["name"]: a["version"] for a in current}[alias] == oldest_first[-1]["to_version"]
    return oldest_first


def test_racing_first_promotes_onto_a_new_alias_leave_a_chained_history(
    client: TestClient, as_role: Any, versions: list[str]
) -> None:
    op = as_role("operator")
    before = snapshot_version(client, as_role)
    responses = race([
        lambda v=v: client.post(f"{BASE}/aliases/canary/promote", json={"version": v, "reason": "race"}, headers=op)
        for v in versions
    ])
    statuses = [(r.status_code, r.json().get("error", {}).get("type")) for r in responses]
    assert all(s in {(200, None), (409, "alias_conflict")} for s in statuses), statuses
    won = sum(1 for s in statuses if s[0] == 200)
    assert won >= 1
    moves = assert_history_is_a_chain(client, as_role, "canary")
    assert len(moves) == won
    assert snapshot_version(client, as_role) == before + won
    events = client.get("/api/v1/events", params={"kind": "alias.promote"}, headers=as_role("viewer")).json()
    assert len(events) == won
    if won > 1:  # the stack unwinds: rollback returns to the previous `to`
        back = client.post(f"{BASE}/aliases/canary/rollback", json={"reason": "undo"}, headers=op)
        assert back.status_code == 200, back.text
        assert back.json()["version"] == moves[-2]["to_version"]


def test_racing_rollbacks_each_undo_one_promote(client: TestClient, as_role: Any, versions: list[str]) -> None:
    op = as_role("operator")
    for version in versions[:5]:
        assert client.post(f"{BASE}/aliases/prod/promote", json={"version": version}, headers=op).status_code == 200
    responses = race([
        lambda: client.post(f"{BASE}/aliases/prod/rollback", json={"reason": "race"}, headers=op)
        for _ in range(RACERS)
    ])
    statuses = [(r.status_code, r.json().get("error", {}).get("type")) for r in responses]
    allowed = {(200, None), (409, "alias_conflict"), (409, "nothing_to_roll_back")}
    assert all(s in allowed for s in statuses), [r.text for r in responses]
    won = sum(1 for s in statuses if s[0] == 200)
    assert 1 <= won <= 4
    moves = assert_history_is_a_chain(client, as_role, "prod")
    assert len(moves) == 5 + won
    assert moves[-1]["to_version"] == versions[4 - won]


def test_racing_promotes_and_rollbacks_keep_one_chain(client: TestClient, as_role: Any, versions: list[str]) -> None:
    op = as_role("operator")
    for version in versions[:3]:
        assert client.post(f"{BASE}/aliases/shadow/promote", json={"version": version}, headers=op).status_code == 200
    calls: list[Callable[[], Any]] = []
    for index in range(RACERS):
        if index % 2:
            calls.append(lambda: client.post(f"{BASE}/aliases/shadow/rollback", json={"reason": "r"}, headers=op))
        else:
            calls.append(lambda v=versions[3 + index // 2]: client.post(
                f"{BASE}/aliases/shadow/promote", json={"version": v}, headers=op))
    responses = race(calls)
    assert all(r.status_code in (200, 409) for r in responses), [r.text for r in responses]
    moves = assert_history_is_a_chain(client, as_role, "shadow")
    assert len(moves) == 3 + sum(1 for r in responses if r.status_code == 200)


def test_concurrent_resolves_of_a_known_issue_let_exactly_one_win(
    client: TestClient, as_role: Any, versions: list[str]
) -> None:
    op = as_role("operator")
    issue = client.post(f"{BASE}/versions/v1/issues", json={"severity": "high", "title": "bad"}, headers=op).json()
    before = snapshot_version(client, as_role)
    responses = race([
        lambda i=i: client.post(f"/api/v1/catalog/issues/{issue['id']}/resolve", json={"resolution": f"fix {i}"},
                                headers=op)
        for i in range(RACERS)
    ])
    statuses = sorted((r.status_code, r.json().get("error", {}).get("type")) for r in responses)
    assert statuses == [(200, None)] + [(409, "issue_already_resolved")] * (RACERS - 1), statuses
    winner = next(r.json() for r in responses if r.status_code == 200)
    shown = client.get(f"{BASE}/versions/v1", headers=as_role("viewer")).json()["issues"][0]
    assert shown["resolution"] == winner["resolution"]
    events = client.get("/api/v1/events", params={"kind": "catalog.issue.resolve"}, headers=as_role("viewer")).json()
    assert len(events) == 1 and events[0]["reason"] == winner["resolution"]
    assert snapshot_version(client, as_role) == before + 1
