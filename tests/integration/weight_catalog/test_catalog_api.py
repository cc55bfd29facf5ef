from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from common.clock import ManualClock
from controlplane.db import session_scope
from controlplane.errors import LifelineError
from tests.support.controlplane_testing import write_artifact
from weight_catalog import aliases

BASE = "/api/v1/catalog/models/llama"


@pytest.fixture
def register(client: TestClient, as_role: Any, tmp_path: Path) -> Any:
    def do(version: str, **artifact: Any) -> dict:
        root = write_artifact(tmp_path / version, **artifact)
        response = client.post(f"{BASE}/versions", json={"version": version, "location": str(root)},
                               headers=as_role("operator"))
        assert response.status_code == 201, response.text
        return response.json()

    return do


def promote(client: TestClient, headers: dict, alias: str, version: str, **extra: Any) -> Any:
    return client.post(f"{BASE}/aliases/{alias}/promote", json={"version": version, **extra}, headers=headers)


def test_register_records_every_shard_hash_size_and_fingerprint(register: Any, tmp_path: Path) -> None:
    version = register("v1", shards=3, shard_bytes=10_000)
    root = tmp_path / "v1"
    by_path = {s["path"]: s for s in version["shards"]}
    assert len(by_path) == 3 + 4  # shards plus tokenizer, tokenizer_config, generation_config, config
    for path, shard in by_path.items():
        data = (root / path).read_bytes()
        assert shard["sha256"] == hashlib.sha256(data).hexdigest()
        assert shard["size"] == len(data)
    assert version["total_bytes"] == sum(s["size"] for s in by_path.values())
    assert set(version["fingerprint_parts"]) == {"tokenizer", "tokenizer_config", "chat_template", "generation_config",
                                            "architecture"}


def test_register_twice_conflicts_and_bad_location_is_typed(client: TestClient, as_role: Any, register: Any,
                                                             tmp_path: Path) -> None:
    register("v1")
    again = client.post(f"{BASE}/versions", json={"version": "v1", "location": str(tmp_path / "v1")},
                        headers=as_role("operator"))
    assert (again.status_code, again.json()["error"]["type"]) == (409, "version_exists")
    (tmp_path / "empty").mkdir()
    for location, kind in [(str(tmp_path / "nope"), "invalid_location"), (str(tmp_path / "empty"), "invalid_artifact"),
                           ("ftp://x/y", "invalid_location")]:
        response = client.post(f"{BASE}/versions", json={"version": "v9", "location": location},
                               headers=as_role("operator"))
        assert (response.status_code, response.json()["error"]["type"]) == (422, kind)
    assert [v["version"] for v in client.get("/api/v1/catalog/versions", headers=as_role("viewer")).json()] == ["v1"]


def test_promote_and_rollback_move_the_alias_and_write_events(client: TestClient, as_role: Any, register: Any) -> None:
    op = as_role("operator")
    for v in ("v1", "v2", "v3"):
        register(v)
        shipped = promote(client, op, "prod", v, reason=f"ship {v}")
        assert shipped.status_code == 200, shipped.text
    snapshot_before = client.get("/api/v1/snapshot", headers=op).json()
    assert snapshot_before["models"]["llama"]["aliases"]["prod"]["version"] == "v3"

    back = client.post(f"{BASE}/aliases/prod/rollback", json={"reason": "quality regression"}, headers=op)
    assert back.status_code == 200, back.text
    assert (back.json()["version"], back.json()["revision"]) == ("v2", 4)
    assert client.post(f"{BASE}/aliases/prod/rollback", json={"reason": "still bad"}, headers=op).json()["version"] == "v1"
    nothing = client.post(f"{BASE}/aliases/prod/rollback", json={"reason": "again"}, headers=op)
    assert (nothing.status_code, nothing.json()["error"]["type"]) == (409, "nothing_to_roll_back")

    history = client.get(f"{BASE}/aliases/prod/history", headers=op).json()
    assert [(h["action"], h["from_version"], h["to_version"]) for h in history] == [
        ("rollback", "v2", "v1"), ("rollback", "v3", "v2"),
        ("promote", "v2", "v3"), ("promote", "v1", "v2"), ("promote", None, "v1"),
    ]
    events = client.get("/api/v1/events", params={"scope": "model:llama/alias:prod"}, headers=op).json()
    assert [e["kind"] for e in events] == ["alias.promote"] * 3 + ["alias.rollback"] * 2
    assert all(e["routing_tier"] == "l7" for e in events)
    assert events[-1]["before"]["version"] == "v2" and events[-1]["after"]["version"] == "v1"
    assert events[-1]["reason"] == "still bad"
    snapshot_after = client.get("/api/v1/snapshot", headers=op).json()
    assert snapshot_after["models"]["llama"]["aliases"]["prod"]["version"] == "v1"
    assert snapshot_after["version"] == snapshot_before["version"] + 2


def test_promote_refuses_a_different_fingerprint_unless_forced_with_reason(
    client: TestClient, as_role: Any, register: Any
) -> None:
    op = as_role("operator")
    register("v1")
    register("v2-newtok", vocab={"x": 0, "y": 1})
    assert promote(client, op, "prod", "v1").status_code == 200
    before_events = client.get("/api/v1/events", headers=op).json()

    for alias in ("prod", "canary"):
        refused = promote(client, op, alias, "v2-newtok")
        assert refused.status_code == 409
        assert refused.json()["error"]["type"] == "fingerprint_mismatch"
        assert "tokenizer" in refused.json()["error"]["message"]
    no_reason = promote(client, op, "prod", "v2-newtok", force=True)
    assert (no_reason.status_code, no_reason.json()["error"]["type"]) == (422, "force_needs_reason")
    assert client.get("/api/v1/events", headers=op).json() == before_events
    assert [a["name"] for a in client.get(f"{BASE}/aliases", headers=op).json()] == ["prod"]

    forced = promote(client, op, "canary", "v2-newtok", force=True, reason="tokenizer migration, approved")
    assert forced.status_code == 200
    event = client.get("/api/v1/events", params={"kind": "alias.promote"}, headers=op).json()[-1]
    assert event["after"]["forced"] is True and event["reason"] == "tokenizer migration, approved"


def test_open_critical_issue_blocks_promote_until_resolved(client: TestClient, as_role: Any, register: Any) -> None:
    op = as_role("operator")
    register("v1")
    issue = client.post(f"{BASE}/versions/v1/issues", json={"severity": "critical", "title": "emits NaN"}, headers=op)
    assert issue.status_code == 201
    minor = client.post(f"{BASE}/versions/v1/issues", json={"severity": "low", "title": "typo"}, headers=op)
    assert minor.status_code == 201
    refused = promote(client, op, "prod", "v1")
    assert (refused.status_code, refused.json()["error"]["type"]) == (409, "critical_known_issue")
    resolved = client.post(f"/api/v1/catalog/issues/{issue.json()['id']}/resolve", json={"resolution": "fixed"}, headers=op)
    assert resolved.status_code == 200 and resolved.json()["resolved_at"] is not None
    twice = client.post(f"/api/v1/catalog/issues/{issue.json()['id']}/resolve", json={}, headers=op)
    assert (twice.status_code, twice.json()["error"]["type"]) == (409, "issue_already_resolved")
    assert client.post("/api/v1/catalog/issues/999999/resolve", json={}, headers=op).status_code == 404
    assert promote(client, op, "prod", "v1").status_code == 200
    bad = client.post(f"{BASE}/versions/v1/issues", json={"severity": "apocalyptic", "title": "x"}, headers=op)
    assert bad.status_code == 422
    shown = client.get(f"{BASE}/versions/v1", headers=op).json()
    assert [(i["severity"], i["resolved_at"] is None) for i in shown["issues"]] == [("critical", False), ("low", True)]


def test_stale_expected_revision_is_refused(client: TestClient, as_role: Any, register: Any) -> None:
    op = as_role("operator")
    register("v1")
    register("v2")
    assert promote(client, op, "prod", "v1", expected_revision=0).status_code == 200
    stale = promote(client, op, "prod", "v2", expected_revision=0)
    assert (stale.status_code, stale.json()["error"]["type"]) == (409, "alias_conflict")
    assert client.get(f"{BASE}/aliases", headers=op).json()[0]["version"] == "v1"
    unknown = promote(client, op, "prod", "v404")
    assert (unknown.status_code, unknown.json()["error"]["type"]) == (404, "version_not_found")


def test_concurrent_promotes_with_the_same_revision_let_exactly_one_win(
    session_factory: Any, register: Any, client: TestClient, as_role: Any
) -> None:
    register("v1")
    register("v2")
    register("v3")
    assert promote(client, as_role("operator"), "prod", "v1").status_code == 200
    outcomes: list[str] = []
    barrier = threading.Barrier(2)

    def attempt(version: str) -> None:
        try:
            with session_scope(session_factory) as session:
                barrier.wait()
                aliases.promote(session, model="llama", alias="prod", version=version, actor="t", reason="race",
                                expected_revision=1, clock=ManualClock())
            outcomes.append("won")
        except LifelineError as exc:
            outcomes.append(exc.error_type)
        except Exception as exc:  # a database-level serialisation failure counts as losing
            outcomes.append(type(exc).__name__)

    threads = [threading.Thread(target=attempt, args=(v,)) for v in ("v2", "v3")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("won") == 1, outcomes
    history = client.get(f"{BASE}/aliases/prod/history", headers=as_role("viewer")).json()
    assert len(history) == 2


def test_verify_reports_every_corrupt_and_missing_shard(client: TestClient, as_role: Any, register: Any,
                                                         tmp_path: Path) -> None:
    op = as_role("operator")
    register("v1", shards=4, shard_bytes=50_000)
    healthy = client.post(f"{BASE}/versions/v1/verify", json={}, headers=op).json()
    assert healthy["healthy"] is True and healthy["checked"] == 8
    root = tmp_path / "v1"
    shard = root / "model-00002-of-00004.safetensors"
    data = bytearray(shard.read_bytes())
    data[12345] ^= 0x01  # one flipped bit, same size
    shard.write_bytes(bytes(data))
    (root / "model-00003-of-00004.safetensors").write_bytes(b"truncated")
    (root / "model-00004-of-00004.safetensors").unlink()
    (root / "stray.bin").write_bytes(b"?")
    report = client.post(f"{BASE}/versions/v1/verify", json={"location": str(root)}, headers=op).json()
    assert report["healthy"] is False
    assert sorted(m["path"] for m in report["mismatched"]) == [
        "model-00002-of-00004.safetensors", "model-00003-of-00004.safetensors"]
    assert report["missing"] == ["model-00004-of-00004.safetensors"]
    assert report["unexpected"] == ["stray.bin"]


def test_api_refuses_filesystem_locations_outside_artifact_roots(client: TestClient, as_role: Any,
                                                                 tmp_path: Path) -> None:
    for location in ("/", "/etc", str(tmp_path / ".." / "..")):
        response = client.post(f"{BASE}/versions", json={"version": "v1", "location": location},
                               headers=as_role("operator"))
        assert (response.status_code, response.json()["error"]["type"]) == (422, "invalid_location")
    assert client.get("/api/v1/catalog/versions", headers=as_role("viewer")).json() == []
