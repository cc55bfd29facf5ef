"""Refused console calls are audited under the signed-in user, as refused API calls are under the token."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.integration.console.conftest import sign_in


def audit_rows(client: TestClient, admin_secret: str) -> list[dict[str, Any]]:
    rows = client.get("/api/v1/audit", headers={"Authorization": f"Bearer {admin_secret}"}).json()
    return list(reversed(rows))


def test_refused_console_calls_with_a_session_are_audited_as_its_user(
    console: TestClient, tokens: dict[str, str]
) -> None:
    sign_in(console, tokens["operator"])
    assert console.post("/console/nowhere", data={"a": "b"}).status_code == 404
    assert console.put("/console/fleet", data={"a": "b"}).status_code == 405
    console.cookies.clear()
    rows = [r for r in audit_rows(console, tokens["admin"]) if r["action"] != "console.sign_in"]
    assert [(r["actor"], r["action"], r["status_code"]) for r in rows] == [
        ("token:test-operator#2", "POST unrouted", 404),
        ("token:test-operator#2", "PUT unrouted", 405),
    ]


def test_a_forged_or_absent_session_is_still_anonymous(console: TestClient, tokens: dict[str, str]) -> None:
    console.cookies.set("lifeline_console", "2.99999999999.nonce.forged", path="/console")
    assert console.post("/console/nowhere", data={}).status_code == 404
    console.cookies.clear()
    assert console.post("/console/nowhere", data={}).status_code == 404
    rows = audit_rows(console, tokens["admin"])
    assert [(r["actor"], r["action"]) for r in rows] == [("anonymous", "POST unrouted")] * 2


def test_a_session_cookie_sent_to_the_api_names_no_one(console: TestClient, tokens: dict[str, str]) -> None:
    """The API takes bearer tokens only: a console cookie there is no credential, for the audit either."""
    sign_in(console, tokens["operator"])
    cookie = console.cookies.get("lifeline_console")
    console.cookies.clear()
    response = console.post("/api/v1/nowhere", headers={"Cookie": f"lifeline_console={cookie}"})
    assert response.status_code == 404
    rows = [r for r in audit_rows(console, tokens["admin"]) if r["action"] != "console.sign_in"]
    assert [(r["actor"], r["action"]) for r in rows] == [("anonymous", "POST unrouted")]
