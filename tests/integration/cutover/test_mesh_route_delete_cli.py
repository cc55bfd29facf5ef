"""Mesh routes deleted through the API, and listed, set and deleted through `lifeline cutover mesh-route`.

Each write is one snapshot version and one `mesh.route` event
(routing_tier mesh); a route a cutover changed is not deleted until that
cutover is rolled back (its rollback restores the route). SQLite and
PostgreSQL.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from cutover.cli import cutover_app
from tests.integration.cutover.test_cutover_mesh_snapshot import SPLIT, catalog  # noqa: F401 - fixture
from tests.integration.cutover.test_cutover_support import topology_two_regions  # noqa: F401 - fixture

pytestmark = pytest.mark.usefixtures("topology_two_regions", "catalog")


def _version(client: TestClient, as_role: Any) -> int:
    return client.get("/api/v1/snapshot", headers=as_role("viewer")).json()["version"]


def _mesh_events(client: TestClient, as_role: Any) -> list[dict[str, Any]]:
    return client.get("/api/v1/events", params={"routing_tier": "mesh", "kind": "mesh.route"},
                      headers=as_role("viewer")).json()


def test_deleting_a_mesh_route_takes_it_out_of_the_snapshot_with_one_version_and_an_event(
        client: TestClient, as_role: Any) -> None:
    op = as_role("operator")
    assert client.put("/api/v1/mesh-routes", json=SPLIT, headers=op).status_code == 200
    before = _version(client, as_role)
    gone = client.delete("/api/v1/mesh-routes", params={"model": "m", "reason": "canary over"}, headers=op)
    assert gone.status_code == 200, gone.text
    assert (gone.json()["model"], gone.json()["revision"]) == ("m", 1)
    snapshot = client.get("/api/v1/snapshot", headers=as_role("viewer")).json()
    assert (snapshot["version"], snapshot["mesh_routes"]) == (before + 1, [])
    assert client.get("/api/v1/mesh-routes", headers=as_role("viewer")).json() == []
    events = _mesh_events(client, as_role)
    deleted = [e for e in events if e["after"] is None]
    assert len(events) == 2 and len(deleted) == 1
    assert (deleted[0]["before"]["revision"], deleted[0]["reason"], deleted[0]["routing_tier"]) == (
        1, "canary over", "mesh")


@pytest.mark.parametrize(("params", "role", "status", "error"), [
    ({"model": "m", "reason": "x", "cohort": "canary"}, "operator", 404, "not_found"),
    ({"model": "nope", "reason": "x"}, "operator", 404, "not_found"),
    ({"model": "m"}, "operator", 422, "invalid_request"),
    ({"model": "m", "reason": "x", "cohort": "has space"}, "operator", 422, "invalid_request"),
    ({"model": "m", "reason": "x", "expected_revision": 7}, "operator", 409, "mesh_route_conflict"),
    ({"model": "m", "reason": "x"}, "viewer", 403, "forbidden"),
    ({"model": "m", "reason": "x"}, "gateway", 403, "forbidden"),
])
def test_a_bad_delete_is_refused_and_changes_nothing(client: TestClient, as_role: Any, params: dict[str, Any],
                                                     role: str, status: int, error: str) -> None:
    assert client.put("/api/v1/mesh-routes", json=SPLIT, headers=as_role("operator")).status_code == 200
    before, events = _version(client, as_role), len(_mesh_events(client, as_role))
    refused = client.delete("/api/v1/mesh-routes", params=params, headers=as_role(role))
    assert (refused.status_code, refused.json()["error"]["type"]) == (status, error), refused.text
    assert _version(client, as_role) == before and len(_mesh_events(client, as_role)) == events
    assert len(client.get("/api/v1/mesh-routes", headers=as_role("viewer")).json()) == 1


def test_a_route_a_cutover_changed_is_kept_until_that_cutover_is_rolled_back(client: TestClient,
                                                                             as_role: Any) -> None:
    op = as_role("operator")
    assert client.put("/api/v1/mesh-routes", json=SPLIT, headers=op).status_code == 200
    plan = client.post("/api/v1/cutovers", json={"scope": {"kind": "zone", "region": "eu", "name": "eu-a"},
                                                 "tier": "mesh", "reason": "eu-a packet loss"}, headers=op).json()
    done = client.post(f"/api/v1/cutovers/{plan['id']}/execute", json={"idempotency_key": "k"}, headers=op)
    assert done.json()["state"] == "completed", done.text
    held = client.delete("/api/v1/mesh-routes", params={"model": "m", "reason": "tidy"}, headers=op)
    assert (held.status_code, held.json()["error"]["type"]) == (409, "mesh_route_in_use")
    assert f"#{plan['id']}" in held.json()["error"]["message"]
    back = client.post(f"/api/v1/cutovers/{plan['id']}/rollback", json={"reason": "eu-a fine"}, headers=op)
    assert back.json()["state"] == "rolled_back", back.text
    assert client.delete("/api/v1/mesh-routes", params={"model": "m", "reason": "tidy"}, headers=op).status_code == 200


@pytest.fixture
def cli(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("LIFELINE_CONTROLPLANE_DATABASE_URL", database_url)
    runner = CliRunner()
    return lambda *args: runner.invoke(cutover_app, ["mesh-route", *args], catch_exceptions=False)


def test_cli_sets_lists_and_deletes_a_mesh_route_each_evented(cli: Any, client: TestClient, as_role: Any) -> None:
    before = _version(client, as_role)
    made = cli("set", "m", "--dest", "v1@eu-a=50", "--dest", "v1@eu-b=49", "--dest", "v2@eu-a=1",
               "--cohort", "beta", "--reason", "1% canary")
    assert made.exit_code == 0, made.output
    assert "v1@eu-a=50 v1@eu-b=49 v2@eu-a=1" in made.output
    [route] = json.loads(cli("list", "--json").output)
    assert (route["cohort"], route["revision"], route["updated_by"].startswith("cli:")) == ("beta", 1, True)
    again = cli("set", "m", "--dest", "v1=1", "--cohort", "beta", "--reason", "all v1", "--expected-revision", "1")
    assert again.exit_code == 0, again.output
    assert "beta" in cli("list").output and "r2" in cli("list").output
    gone = cli("delete", "m", "--cohort", "beta", "--reason", "beta over")
    assert gone.exit_code == 0 and gone.output.startswith("deleted: "), gone.output
    assert json.loads(cli("list", "--json").output) == []
    assert _version(client, as_role) == before + 3
    assert [e["after"] is None for e in _mesh_events(client, as_role)].count(True) == 1
    assert len(_mesh_events(client, as_role)) == 3


@pytest.mark.parametrize(("args", "code", "says"), [
    (("set", "m", "--dest", "v1@eu-a", "--reason", "x"), 2, "is not VERSION[@ZONE]=WEIGHT"),
    (("set", "m", "--dest", "v1=0", "--reason", "x"), 2, "weight > 0"),
    (("set", "m", "--dest", "v9=1", "--reason", "x"), 1, "error: mesh_unknown_version:"),
    (("set", "m", "--dest", "v1=1", "--cohort", "has space", "--reason", "x"), 2, "cohort"),
    (("delete", "m", "--reason", "x"), 1, "error: not_found:"),
])
def test_cli_refusals_exit_with_the_error_and_change_nothing(cli: Any, client: TestClient, as_role: Any,
                                                             args: tuple[str, ...], code: int, says: str) -> None:
    before = _version(client, as_role)
    refused = cli(*args)
    assert refused.exit_code == code and says in refused.output, refused.output
    assert _version(client, as_role) == before and _mesh_events(client, as_role) == []
