from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.support.controlplane_testing import write_artifact


def test_snapshot_version_grows_with_each_routing_change_and_etag_gives_304(client: TestClient, as_role: Any) -> None:
    viewer, op = as_role("viewer"), as_role("operator")
    first = client.get("/api/v1/snapshot", headers=viewer)
    assert first.status_code == 200
    assert first.json()["version"] == 0
    etag = first.headers["etag"]
    unchanged = client.get("/api/v1/snapshot", headers={**viewer, "If-None-Match": etag})
    assert unchanged.status_code == 304
    assert unchanged.content == b""

    client.post("/api/v1/regions", json={"name": "us-east"}, headers=op)
    client.post("/api/v1/clusters", json={"name": "us-a", "region": "us-east", "model": "llama", "weight": 70}, headers=op)
    client.post("/api/v1/clusters", json={"name": "us-b", "region": "us-east", "model": "llama", "weight": 30}, headers=op)
    client.patch("/api/v1/clusters/us-b", json={"state": "draining", "reason": "r"}, headers=op)
    client.post("/api/v1/regions/us-east/ejections", json={"instance_id": "e1", "generation": 4, "reason": "r"}, headers=op)

    changed = client.get("/api/v1/snapshot", headers={**viewer, "If-None-Match": etag})
    assert changed.status_code == 200
    body = changed.json()
    assert body["version"] == 4
    assert changed.headers["etag"] != etag
    assert body["tier_weights"] == {"llama": {"us-east": {"*": 70}}}
    assert body["drains"] == ["us-b"]
    assert body["ejections"] == [{"region": "us-east", "instance_id": "e1", "generation": 4, "reason": "r"}]

    versions = [body["version"]]
    for weight in (10, 20):
        client.patch("/api/v1/clusters/us-a", json={"weight": weight, "reason": "shift"}, headers=op)
        versions.append(client.get("/api/v1/snapshot", headers=viewer).json()["version"])
    assert versions == sorted(set(versions))


def test_failed_change_does_not_advance_the_snapshot(client: TestClient, as_role: Any) -> None:
    op = as_role("operator")
    client.post("/api/v1/regions", json={"name": "us-east"}, headers=op)
    before = client.get("/api/v1/snapshot", headers=op).json()["version"]
    assert client.patch("/api/v1/clusters/ghost", json={"weight": 1, "reason": "r"}, headers=op).status_code == 404
    assert client.post("/api/v1/clusters", json={"name": "c", "region": "gone", "model": "m"}, headers=op).status_code == 404
    assert client.get("/api/v1/snapshot", headers=op).json()["version"] == before


CATALOG = "/api/v1/catalog/models/llama"


def _version(client: TestClient, headers: dict[str, str]) -> int:
    return client.get("/api/v1/snapshot", headers=headers).json()["version"]


@pytest.fixture
def registered(client: TestClient, as_role: Any, tmp_path: Path) -> None:
    op = as_role("operator")
    for name, template in (("v1", None), ("v2", None), ("v3", "{{ different }}")):
        extra = {"chat_template": template} if template else {}
        root = write_artifact(tmp_path / name, seed=int(name[1]), **extra)
        response = client.post(f"{CATALOG}/versions", json={"version": name, "location": str(root)}, headers=op)
        assert response.status_code == 201, response.text


def test_every_routing_change_advances_the_snapshot_by_one_and_refusals_by_none(
    client: TestClient, as_role: Any, registered: None
) -> None:
    op = as_role("operator")
    steps: list[tuple[str, str, str, dict[str, Any], int]] = [
        ("region (not routing)", "POST", "/api/v1/regions", {"name": "us"}, 0),
        ("cluster create", "POST", "/api/v1/clusters", {"name": "a", "region": "us", "model": "llama"}, 1),
        ("cluster weight", "PATCH", "/api/v1/clusters/a", {"weight": 40, "reason": "shift"}, 1),
        ("drain", "PATCH", "/api/v1/clusters/a", {"state": "draining", "reason": "maint"}, 1),
        ("cluster eject", "PATCH", "/api/v1/clusters/a", {"state": "ejected", "reason": "dead", "routing_tier": "anycast"}, 1),
        ("reactivate", "PATCH", "/api/v1/clusters/a", {"state": "active", "reason": "back"}, 1),
        ("stale revision", "PATCH", "/api/v1/clusters/a", {"weight": 1, "reason": "r", "expected_revision": 1}, 0),
        ("instance eject", "POST", "/api/v1/regions/us/ejections", {"instance_id": "e1", "generation": 2, "reason": "r"}, 1),
        ("eject twice", "POST", "/api/v1/regions/us/ejections", {"instance_id": "e1", "generation": 2, "reason": "r"}, 0),
        ("promote", "POST", f"{CATALOG}/aliases/prod/promote", {"version": "v1"}, 1),
        ("promote again", "POST", f"{CATALOG}/aliases/prod/promote", {"version": "v2"}, 1),
        ("unchanged", "POST", f"{CATALOG}/aliases/prod/promote", {"version": "v2"}, 0),
        ("fingerprint", "POST", f"{CATALOG}/aliases/prod/promote", {"version": "v3"}, 0),
        ("canary", "POST", f"{CATALOG}/aliases/canary/promote", {"version": "v1"}, 1),
        ("rollback", "POST", f"{CATALOG}/aliases/prod/rollback", {"reason": "regressed"}, 1),
        ("nothing left", "POST", f"{CATALOG}/aliases/prod/rollback", {"reason": "again"}, 0),
    ]
    for label, method, path, body, advance in steps:
        before = _version(client, op)
        response = client.request(method, path, json=body, headers=op)
        succeeded = response.status_code < 400
        assert succeeded == (advance == 1 or label.startswith("region")), (label, response.text)
        assert _version(client, op) == before + advance, label

    ejection_id = client.get("/api/v1/regions/us/ejections", headers=op).json()[0]["id"]
    before = _version(client, op)
    readmit = client.delete(f"/api/v1/regions/us/ejections/{ejection_id}", params={"reason": "fixed"}, headers=op)
    assert readmit.status_code == 204
    assert _version(client, op) == before + 1


def test_snapshot_shows_open_known_issues_and_advances_when_one_opens_or_closes(
    client: TestClient, as_role: Any, registered: None
) -> None:
    op, viewer = as_role("operator"), as_role("viewer")
    assert client.post(f"{CATALOG}/aliases/prod/promote", json={"version": "v1"}, headers=op).status_code == 200
    first = client.get("/api/v1/snapshot", headers=viewer)
    assert first.json()["models"]["llama"]["versions"]["v1"]["known_issues"] == []

    high = client.post(f"{CATALOG}/versions/v1/issues", json={"severity": "high", "title": "drops stop tokens"},
                       headers=op).json()
    crit = client.post(f"{CATALOG}/versions/v1/issues", json={"severity": "critical", "title": "NaNs at bf16"},
                       headers=op).json()
    second = client.get("/api/v1/snapshot", headers={**viewer, "If-None-Match": first.headers["etag"]})
    assert second.status_code == 200
    assert second.json()["version"] == first.json()["version"] + 2
    assert second.json()["models"]["llama"]["versions"]["v1"]["known_issues"] == [
        {"id": high["id"], "severity": "high", "summary": "drops stop tokens"},
        {"id": crit["id"], "severity": "critical", "summary": "NaNs at bf16"},
    ]

    resolved = client.post(f"/api/v1/catalog/issues/{crit['id']}/resolve", json={"resolution": "fixed kernel"},
                           headers=op)
    assert resolved.status_code == 200
    third = client.get("/api/v1/snapshot", headers=viewer).json()
    assert third["version"] == second.json()["version"] + 1
    assert third["models"]["llama"]["versions"]["v1"]["known_issues"] == [
        {"id": high["id"], "severity": "high", "summary": "drops stop tokens"}
    ]

    # Refused or malformed issue calls change neither the issues nor the version.
    refused = [
        client.post(f"/api/v1/catalog/issues/{crit['id']}/resolve", json={}, headers=op),
        client.post("/api/v1/catalog/issues/99999/resolve", json={}, headers=op),
        client.post(f"{CATALOG}/versions/v1/issues", json={"severity": "dire", "title": "x"}, headers=op),
        client.post(f"{CATALOG}/versions/v9/issues", json={"severity": "low", "title": "x"}, headers=op),
        client.post(f"{CATALOG}/versions/v1/issues", json={"severity": "low", "title": ""}, headers=op),
    ]
    assert [(r.status_code, r.json()["error"]["type"]) for r in refused] == [
        (409, "issue_already_resolved"), (404, "issue_not_found"), (422, "invalid_request"),
        (404, "version_not_found"), (422, "invalid_request"),
    ]
    assert client.get("/api/v1/snapshot", headers=viewer).json() == third


def test_snapshot_is_the_contract_record_with_file_digests_and_weights_digest(
    client: TestClient, as_role: Any, tmp_path: Path
) -> None:
    import hashlib

    from contract.identity import weights_digest
    from contract.snapshot import RoutingSnapshot

    root = write_artifact(tmp_path / "v1", shards=2)
    op = as_role("operator")
    assert client.post("/api/v1/catalog/models/llama/versions", json={"version": "v1", "location": str(root)},
                       headers=op).status_code == 201
    assert client.post("/api/v1/catalog/models/llama/aliases/prod/promote", json={"version": "v1"},
                       headers=op).status_code == 200
    snapshot = RoutingSnapshot.model_validate(client.get("/api/v1/snapshot", headers=as_role("gateway")).json())
    entry = snapshot.models["llama"].versions["v1"]
    on_disk = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in root.iterdir()}
    assert entry.files == {name: on_disk[name] for name in ("tokenizer.json", "tokenizer_config.json",
                                                           "config.json", "generation_config.json")}
    assert entry.shards == on_disk  # every recorded file: a cold-tier agent checks its staged copy by them
    assert entry.weights_digest == weights_digest(on_disk)
    assert entry.weights_digest != weights_digest({})
    assert snapshot.models["llama"].aliases["prod"].version == "v1"


def test_an_unchanged_poll_is_answered_before_any_snapshot_is_built(
    client: TestClient, as_role: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from controlplane.snapshot import service

    viewer = as_role("viewer")
    etag = client.get("/api/v1/snapshot", headers=viewer).headers["etag"]
    built: list[int] = []
    real = service.build_snapshot
    monkeypatch.setattr(service, "build_snapshot", lambda session: built.append(1) or real(session))
    assert client.get("/api/v1/snapshot", headers={**viewer, "If-None-Match": etag}).status_code == 304
    assert built == []
    assert client.get("/api/v1/snapshot", headers=viewer).status_code == 200  # the body built for that version
    assert built == []


def test_a_changed_snapshot_is_built_once_for_every_poller_that_asks(
    client: TestClient, as_role: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from controlplane.snapshot import service

    viewer, operator = as_role("viewer"), as_role("operator")
    assert client.post("/api/v1/regions", json={"name": "eu"}, headers=operator).status_code == 201
    before = client.get("/api/v1/snapshot", headers=viewer)
    built: list[int] = []
    real = service.build_snapshot
    monkeypatch.setattr(service, "build_snapshot", lambda session: built.append(1) or real(session))
    cluster = {"name": "eu-llama", "region": "eu", "model": "llama"}
    assert client.post("/api/v1/clusters", json=cluster, headers=operator).status_code == 201
    answers = [client.get("/api/v1/snapshot", headers={**viewer, "If-None-Match": before.headers["etag"]})
               for _ in range(5)]
    assert {a.status_code for a in answers} == {200}
    assert {a.headers["etag"] for a in answers} == {answers[0].headers["etag"]} != {before.headers["etag"]}
    assert answers[0].json()["version"] == before.json()["version"] + 1
    assert built == [1]


def test_the_snapshot_names_the_databases_epoch_and_its_etag_matches_no_other_database(
    client: TestClient, as_role: Any, session_factory: Any, clock: Any
) -> None:
    from contract.snapshot import RoutingSnapshot, etag_for
    from controlplane.db import session_scope
    from controlplane.routing_version import service as routing_version

    viewer = as_role("viewer")
    first = client.get("/api/v1/snapshot", headers=viewer)
    epoch = first.json()["controlplane_epoch"]
    assert epoch and RoutingSnapshot.model_validate(first.json()).controlplane_epoch == epoch
    assert first.headers["etag"] == etag_for(0, epoch) == f'"snapshot-{epoch}-0"'
    # Another database's equal version (or a tag from before epochs) does not match: the whole snapshot comes back.
    for tag in (etag_for(0, "0f0f0f0f-dead-4bee-8bad-000000000099"), etag_for(0)):
        assert client.get("/api/v1/snapshot", headers={**viewer, "If-None-Match": tag}).status_code == 200
    assert client.get("/api/v1/snapshot", headers={**viewer, "If-None-Match": f"W/{first.headers['etag']}"}
                      ).status_code == 304

    with session_scope(session_factory) as session:  # what `lifeline controlplane epoch rotate` does
        old, new = routing_version.rotate_epoch(session, clock=clock)
    assert old == epoch and new != epoch
    rotated = client.get("/api/v1/snapshot", headers={**viewer, "If-None-Match": first.headers["etag"]})
    assert rotated.status_code == 200
    assert (rotated.json()["controlplane_epoch"], rotated.json()["version"]) == (new, 1)
    assert rotated.headers["etag"] == etag_for(1, new)


def test_a_gateway_token_reads_the_snapshot_and_nothing_else(client: TestClient, as_role: Any) -> None:
    gateway = as_role("gateway")
    assert client.get("/api/v1/snapshot", headers=gateway).status_code == 200
    for method, path in [("GET", "/api/v1/regions"), ("GET", "/api/v1/events"), ("GET", "/api/v1/catalog/versions"),
                         ("GET", "/api/v1/audit"), ("POST", "/api/v1/regions"), ("GET", "/api/v1/tokens")]:
        response = client.request(method, path, headers=gateway, json={"name": "x"})
        assert (response.status_code, response.json()["error"]["type"]) == (403, "forbidden"), path
