"""A bad version on a non-prod alias: its canary is inherited from the good one, and an agent's report rolls it back.

`canary inherit` gives a re-exported version the known-good version's
canary; `POST …/aliases/{alias}/canary-failures` (agents and operators) is
the catalog's one-call rollback, refused for prod and idempotent by the
alias revision the agent saw. Both databases.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from controlplane.auth import service as auth_service
from controlplane.auth.roles import Role
from controlplane.db import session_scope
from controlplane.errors import LifelineError
from tests.support.controlplane_testing import write_artifact
from weight_catalog import canary
from weight_catalog.models import WeightVersion

BASE = "/api/v1/catalog/models/llama"
RECORD = {"prompt_token_ids": [1, 2, 3], "output_token_ids": [7, 8, 9], "max_ttft_s": 2.0}


@pytest.fixture
def agent(tokens: dict[str, str], session_factory: Any, clock: Any) -> dict[str, str]:
    with session_scope(session_factory) as session:
        _, secret = auth_service.create_token(session, name="eu-west", role=Role.AGENT, created_by="test", clock=clock)
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
def catalog(client: TestClient, as_role: Any, tmp_path: Path) -> dict[str, str]:
    """v1 (prod and canary), v2 promoted to canary over it; v1 has a canary record."""
    op = as_role("operator")
    for version in ("v1", "v2"):
        root = write_artifact(tmp_path / version)
        assert client.post(f"{BASE}/versions", json={"version": version, "location": str(root)},
                           headers=op).status_code == 201
    for alias, version in (("prod", "v1"), ("canary", "v1"), ("canary", "v2")):
        moved = client.post(f"{BASE}/aliases/{alias}/promote", json={"version": version, "reason": "ship"},
                            headers=op)
        assert moved.status_code == 200, moved.text
    return op


def failure(version: str = "v2", revision: int = 2) -> dict[str, Any]:
    return {"version": version, "expected_revision": revision, "instances": ["eu-west-a-7"],
            "reason": "wrong_output: canary: token 0 is 5, recorded 7"}


def test_an_agents_canary_failure_rolls_the_alias_back_once(client: TestClient, catalog: dict, agent: dict) -> None:
    snapshot = client.get("/api/v1/snapshot", headers=catalog).json()
    assert snapshot["models"]["llama"]["aliases"]["canary"] == {"version": "v2", "revision": 2}

    back = client.post(f"{BASE}/aliases/canary/canary-failures", json=failure(), headers=agent)
    assert back.status_code == 200, back.text
    assert (back.json()["version"], back.json()["revision"]) == ("v1", 3)
    # A second report of the same failure (another region, a retry) finds the alias moved: nothing changes.
    again = client.post(f"{BASE}/aliases/canary/canary-failures", json=failure(), headers=agent)
    assert (again.status_code, again.json()["error"]["type"]) == (409, "alias_conflict")

    history = client.get(f"{BASE}/aliases/canary/history", headers=catalog).json()
    assert [(h["action"], h["from_version"], h["to_version"]) for h in history][:1] == [("rollback", "v2", "v1")]
    [event] = [e for e in client.get("/api/v1/events", params={"scope": "model:llama/alias:canary"},
                                     headers=catalog).json() if e["kind"] == "alias.rollback"]
    assert event["routing_tier"] == "l7" and "eu-west" in event["actor"]  # the agent token's actor
    assert "canary failed on v2: wrong_output" in event["reason"] and "eu-west-a-7" in event["reason"]
    after = client.get("/api/v1/snapshot", headers=catalog).json()
    assert after["models"]["llama"]["aliases"]["canary"]["version"] == "v1"
    assert after["version"] > snapshot["version"]


def test_prod_a_moved_alias_and_other_roles_are_refused(client: TestClient, catalog: dict, agent: dict,
                                                        as_role: Any) -> None:
    prod = client.post(f"{BASE}/aliases/prod/canary-failures", json=failure("v1", 1), headers=agent)
    assert (prod.status_code, prod.json()["error"]["type"]) == (409, "automatic_rollback_refused")
    stale = client.post(f"{BASE}/aliases/canary/canary-failures", json=failure(revision=1), headers=agent)
    assert (stale.status_code, stale.json()["error"]["type"]) == (409, "alias_conflict")
    other = client.post(f"{BASE}/aliases/canary/canary-failures", json=failure("v1"), headers=agent)
    assert (other.status_code, other.json()["error"]["type"]) == (409, "alias_conflict")
    for role in ("viewer", "gateway"):
        assert client.post(f"{BASE}/aliases/canary/canary-failures", json=failure(),
                           headers=as_role(role)).status_code == 403
    assert client.get(f"{BASE}/aliases", headers=catalog).json()[0]["version"] == "v2"  # canary: unchanged


def test_a_version_inherits_the_canary_of_the_version_it_must_answer_as(
    client: TestClient, catalog: dict, session_factory: Any, clock: Any
) -> None:
    with session_scope(session_factory) as session:
        with pytest.raises(LifelineError) as nothing:
            canary.inherit(session, model="llama", version="v2", from_version="v1", actor="test", clock=clock)
    assert nothing.value.error_type == "no_canary_to_inherit"
    with session_scope(session_factory) as session:
        session.execute(update(WeightVersion).where(WeightVersion.version == "v1").values(canary=RECORD))
    with session_scope(session_factory) as session:
        canary.inherit(session, model="llama", version="v2", from_version="v1", actor="test", clock=clock)
    snapshot = client.get("/api/v1/snapshot", headers=catalog).json()
    assert snapshot["models"]["llama"]["versions"]["v2"]["canary"]["output_token_ids"] == [7, 8, 9]
    [event] = client.get("/api/v1/events", params={"kind": "catalog.canary.record"}, headers=catalog).json()
    assert event["after"]["inherited_from"] == "v1" and event["scope"] == "model:llama/version:v2"
    with session_scope(session_factory) as session:
        with pytest.raises(LifelineError) as again:
            canary.inherit(session, model="llama", version="v2", from_version="v1", actor="test", clock=clock)
    assert again.value.error_type == "canary_exists"
