"""Racing token operations over the API, on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.integration.weight_catalog.test_catalog_races import RACERS, race


def _bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def test_concurrent_revokes_of_one_token_let_exactly_one_win(client: TestClient, as_role: Any) -> None:
    admin = as_role("admin")
    victim = client.post("/api/v1/tokens", json={"name": "victim", "role": "viewer"}, headers=admin).json()
    responses = race([lambda: client.post(f"/api/v1/tokens/{victim['id']}/revoke", headers=admin)
                      for _ in range(RACERS)])
    statuses = sorted((r.status_code, r.json().get("error", {}).get("type")) for r in responses)
    assert statuses == [(200, None)] + [(409, "token_already_revoked")] * (RACERS - 1), statuses
    assert client.get("/api/v1/whoami", headers=_bearer(victim["token"])).status_code == 401


def test_concurrent_creates_each_get_their_own_token(client: TestClient, as_role: Any) -> None:
    admin = as_role("admin")
    responses = race([lambda i=i: client.post("/api/v1/tokens", json={"name": f"t{i}", "role": "operator"},
                                              headers=admin) for i in range(RACERS)])
    assert [r.status_code for r in responses] == [201] * RACERS
    assert len({r.json()["id"] for r in responses}) == RACERS
    for response in responses:
        assert client.get("/api/v1/whoami", headers=_bearer(response.json()["token"])).json()["role"] == "operator"


def test_admins_revoking_each_other_in_a_ring_always_leave_an_admin(client: TestClient, as_role: Any) -> None:
    created = [client.post("/api/v1/tokens", json={"name": f"admin{i}", "role": "admin"},
                           headers=as_role("admin")).json() for i in range(RACERS)]
    assert client.post(f"/api/v1/tokens/{client.get('/api/v1/whoami', headers=as_role('admin')).json()['actor'].split('#')[1]}/revoke",
                       headers=_bearer(created[0]["token"])).status_code == 200
    responses = race([
        lambda i=i: client.post(f"/api/v1/tokens/{created[(i + 1) % RACERS]['id']}/revoke",
                                headers=_bearer(created[i]["token"]))
        for i in range(RACERS)
    ])
    assert all(r.status_code in (200, 401, 409) for r in responses), [r.text for r in responses]
    won = sum(1 for r in responses if r.status_code == 200)
    active = [t for t in created if client.get("/api/v1/whoami", headers=_bearer(t["token"])).status_code == 200]
    assert len(active) >= 1
    assert len(active) == RACERS - won
