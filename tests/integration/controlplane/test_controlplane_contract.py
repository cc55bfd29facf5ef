"""What clients and post-mortems rely on: audit rows, documented errors, timestamps, ETags."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.support.answer_contract import AnswerContract

DOCS = Path(__file__).resolve().parents[3] / "docs" / "controlplane.md"


def audit_rows(client: TestClient, as_role: Any) -> list[dict[str, Any]]:
    return list(reversed(client.get("/api/v1/audit", headers=as_role("admin")).json()))


def test_unrouted_calls_with_a_valid_token_record_the_real_actor_and_the_method(
    client: TestClient, as_role: Any
) -> None:
    op = as_role("operator")
    assert client.post("/api/v1/nowhere", headers=op).status_code == 404
    assert client.put("/api/v1/regions", headers=op, json={}).status_code == 405  # the path takes GET and POST
    assert client.delete("/api/v1/tokens", headers=op).status_code == 405
    rows = audit_rows(client, as_role)
    assert [(r["actor"], r["action"], r["status_code"]) for r in rows] == [
        ("token:test-operator#2", "POST unrouted", 404),
        ("token:test-operator#2", "PUT unrouted", 405),
        ("token:test-operator#2", "DELETE unrouted", 405),
    ]
    for row in rows:  # no other route's name
        assert not re.search(r"list_|create_|get_", row["action"]), row


def test_a_nul_in_the_path_is_audited_on_both_databases(client: TestClient, as_role: Any) -> None:
    response = client.post("/api/v1/regions%00x/zones", headers=as_role("operator"), json={"name": "a"})
    assert response.status_code in (404, 422)
    rows = audit_rows(client, as_role)
    assert len(rows) == 1 and rows[0]["target"] == "/api/v1/regions%00x/zones"


def test_the_audit_row_exists_before_the_response_starts(client: TestClient, as_role: Any,
                                                          answer_contract: AnswerContract) -> None:
    """Wrap the app: when the response start reaches the outside, its audit row must already be stored."""
    from sqlalchemy import func, select

    from controlplane.auth.models import AuditRecord

    inner = client.app
    seen: list[int] = []

    async def outer(scope: Any, receive: Any, send: Any) -> None:
        async def spy(message: Any) -> None:
            if message["type"] == "http.response.start":
                with inner.state.session_factory() as session:
                    seen.append(session.scalar(select(func.count()).select_from(AuditRecord)))
            await send(message)

        await inner(scope, receive, spy if scope["type"] == "http" else send)

    with answer_contract.watch(TestClient(outer, raise_server_exceptions=False), app=inner) as wrapped:
        assert wrapped.post("/api/v1/regions", json={"name": "eu"}, headers=as_role("operator")).status_code == 201
        assert wrapped.post("/api/v1/regions", json={"name": "eu"}, headers=as_role("viewer")).status_code == 403
    assert seen == [1, 2]


def test_failed_cli_mutations_are_audited(database_url: str, session_factory: Any, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch, client: TestClient,
                                          as_role: Any) -> None:
    from typer.testing import CliRunner

    from lifeline.cli import app

    monkeypatch.setenv("LIFELINE_CONTROLPLANE_DATABASE_URL", database_url)
    runner = CliRunner()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").symlink_to(tmp_path / "gone")
    cases = [
        (["catalog", "register", "llama", "v1", str(broken)], "catalog.register", 1),
        (["catalog", "register", "llama", "bad/name", str(broken)], "catalog.register", 2),
        (["catalog", "promote", "llama", "prod", "v404"], "catalog.promote", 1),
        (["catalog", "issue", "add", "llama", "v1", "--severity", "dire", "--title", "t"], "catalog.issue.add", 2),
        (["controlplane", "token", "create", "--role", "root"], "token.create", 2),
        (["controlplane", "token", "revoke", "999"], "token.revoke", 1),
    ]
    for args, _, code in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == code, (args, result.output)
        assert "error: " in result.output and "Traceback" not in result.output
    rows = [r for r in audit_rows(client, as_role) if r["actor"].startswith("cli:")]
    assert [(r["action"], r["outcome"]) for r in rows] == [(action, "failed") for _, action, _ in cases]


def test_openapi_documents_auth_not_found_and_conflict_responses(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    promote = paths["/api/v1/catalog/models/{model}/aliases/{alias}/promote"]["post"]["responses"]
    assert {"200", "401", "403", "404", "409", "422", "503"} <= set(promote)
    assert promote["409"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    regions = paths["/api/v1/regions"]["get"]["responses"]
    assert {"401", "403"} <= set(regions) and "409" not in regions
    for path, operations in paths.items():
        if path.startswith("/api/v1/"):
            for operation in operations.values():
                assert {"401", "403"} <= set(operation["responses"]), path


def test_timestamps_carry_a_utc_offset_on_both_databases(client: TestClient, as_role: Any) -> None:
    created = client.post("/api/v1/regions", json={"name": "eu"}, headers=as_role("operator")).json()
    assert created["created_at"] == "2026-01-01T00:00:00Z", created  # RFC 3339 UTC, as PostgreSQL's
    read = client.get("/api/v1/regions/eu", headers=as_role("viewer")).json()
    assert read["created_at"] == created["created_at"]
    event = client.get("/api/v1/events", headers=as_role("viewer")).json()[0]
    assert event["started_at"] == event["ended_at"] == "2026-01-01T00:00:00Z"
    # a filter with another offset means the same instant on both databases
    later = "2026-01-01T02:00:00+02:00"  # == ManualClock's start
    assert [e["kind"] for e in client.get("/api/v1/events", params={"since": later},
                                          headers=as_role("viewer")).json()] == ["topology.region.create"]
    assert client.get("/api/v1/events", params={"since": "2026-01-01T01:00:01+01:00"},
                      headers=as_role("viewer")).json() == []


@pytest.mark.parametrize("header", ['W/"snapshot-{e}-{v}"', "*", '"snapshot-{e}-0", W/"snapshot-{e}-{v}"',
                                    ' "snapshot-{e}-{v}" '])
def test_if_none_match_honours_weak_tags_lists_and_star(client: TestClient, as_role: Any, header: str) -> None:
    viewer = as_role("viewer")
    body = client.get("/api/v1/snapshot", headers=viewer).json()
    version, epoch = body["version"], body["controlplane_epoch"]
    response = client.get("/api/v1/snapshot", headers={**viewer, "If-None-Match": header.format(v=version, e=epoch)})
    assert response.status_code == 304
    stale = client.get("/api/v1/snapshot", headers={**viewer, "If-None-Match": f'W/"snapshot-{epoch}-{version + 1}"'})
    assert stale.status_code == 200


def test_every_error_type_is_documented() -> None:
    import importlib
    import pkgutil

    import controlplane
    import weight_catalog
    from common.errors import LifelineError

    for package in (controlplane, weight_catalog):
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if not module.name.endswith(("cli", "demo")):
                importlib.import_module(module.name)
    types = {"http_error", "method_not_allowed", "not_found", "invalid_request", "conflict", "internal_error"}

    def walk(cls: type) -> None:
        for sub in cls.__subclasses__():
            if sub.__module__.startswith(("controlplane", "weight_catalog")):
                types.add(sub.error_type)
            walk(sub)

    walk(LifelineError)
    documented = set(re.findall(r"`([a-z_]+)`", DOCS.read_text()))
    missing = sorted(types - documented)
    assert missing == [], ", ".join(missing)
