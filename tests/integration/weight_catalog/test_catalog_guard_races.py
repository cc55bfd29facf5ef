"""An alias guard and the fact it guards cannot pass each other: a promote never lands on a version whose
critical known issue committed first.

Promote reads the target's open critical issues, then moves the alias. On
PostgreSQL (READ COMMITTED) an issue opened in between, committed before
the promote, went unseen: the promote was acknowledged after the issue was,
and prod served a version with an open critical issue without `force` —
write skew, not a compare-and-set the alias row lock could catch. The
interleaving is made deterministic here: the issue's transaction is held
open until the promote is seen waiting on a lock (pg_stat_activity), then
committed. SQLite serializes writers at BEGIN IMMEDIATE, so the same test
holds there without the wait.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from common.clock import ManualClock
from controlplane.db import session_scope
from tests.support.controlplane_testing import write_artifact
from tests.support.waiting import until
from weight_catalog import aliases, known_issues
from weight_catalog.errors import CriticalKnownIssue
from weight_catalog.models import Severity

BASE = "/api/v1/catalog/models/llama"


def register(client: TestClient, as_role: Any, tmp_path: Path, name: str, seed: int) -> None:
    root = write_artifact(tmp_path / name, seed=seed)
    response = client.post(f"{BASE}/versions", json={"version": name, "location": str(root)},
                           headers=as_role("operator"))
    assert response.status_code == 201, response.text


def waiting_on_a_lock(session_factory: Any) -> bool:
    with session_factory() as probe:
        return bool(probe.scalar(text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'")))


@pytest.mark.parametrize("move", ["promote", "rollback"])
def test_a_move_never_lands_on_a_version_whose_critical_issue_committed_first(
    client: TestClient, as_role: Any, session_factory: Any, clock: ManualClock, tmp_path: Path, move: str
) -> None:
    op = as_role("operator")
    register(client, as_role, tmp_path, "v1", 1)
    register(client, as_role, tmp_path, "v2", 2)
    for version in (["v1", "v2"] if move == "rollback" else ["v1"]):
        assert client.post(f"{BASE}/aliases/canary/promote", json={"version": version}, headers=op).status_code == 200
    target = "v1" if move == "rollback" else "v2"

    issue_session = session_factory()
    known_issues.add_issue(issue_session, model="llama", version=target, severity=Severity.CRITICAL,
                           title="corrupts outputs", description="", actor="test", clock=clock)
    outcome: list[Any] = []

    def run_move() -> None:
        try:
            with session_scope(session_factory) as session:
                if move == "promote":
                    aliases.promote(session, model="llama", alias="canary", version=target, actor="test", reason="go",
                                    clock=clock)
                else:
                    aliases.rollback(session, model="llama", alias="canary", actor="test", reason="back", clock=clock)
            outcome.append("moved")
        except CriticalKnownIssue as exc:
            outcome.append(exc)

    mover = threading.Thread(target=run_move)
    mover.start()
    try:
        if session_factory.kw["bind"].dialect.name == "postgresql":
            asyncio.run(until(lambda: waiting_on_a_lock(session_factory), "the move waits on the issue's lock"))
        issue_session.commit()  # the issue is acknowledged first
    finally:
        issue_session.close()
        mover.join(timeout=120)
    assert not mover.is_alive()
    [result] = outcome
    assert isinstance(result, CriticalKnownIssue), result
    shown = {a["name"]: a["version"] for a in client.get(f"{BASE}/aliases", headers=as_role("viewer")).json()}
    assert shown["canary"] == ("v1" if move == "promote" else "v2")
    moves = client.get("/api/v1/events", params={"kind": f"alias.{move}"}, headers=as_role("viewer")).json()
    assert len(moves) == (1 if move == "promote" else 0)  # the setup's first promote only; a refused move wrote none
