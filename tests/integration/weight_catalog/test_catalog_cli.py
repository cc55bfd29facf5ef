"""`lifeline catalog ...` end to end through the real command tree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from controlplane.auth.models import AuditRecord
from controlplane.db import session_scope
from tests.support.controlplane_testing import write_artifact
from lifeline.cli import app


@pytest.fixture
def lifeline(database_url: str, session_factory: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("LIFELINE_CONTROLPLANE_DATABASE_URL", database_url)
    runner = CliRunner()

    def run(*args: str) -> Any:
        return runner.invoke(app, list(args), catch_exceptions=False)

    return run


def test_catalog_cli_register_promote_verify_rollback(lifeline: Any, tmp_path: Path, session_factory: Any) -> None:
    v1 = write_artifact(tmp_path / "v1", seed=1)
    v2 = write_artifact(tmp_path / "v2", seed=2)
    v3 = write_artifact(tmp_path / "v3", seed=3, chat_template="{{ other }}")
    for name, root in (("v1", v1), ("v2", v2), ("v3", v3)):
        result = lifeline("catalog", "register", "llama", name, str(root), "--workers", "2")
        assert result.exit_code == 0, result.output
        assert f"registered llama {name}" in result.output

    listed = json.loads(lifeline("catalog", "list", "--json").output)
    assert [v["version"] for v in listed] == ["v1", "v2", "v3"]
    shown = json.loads(lifeline("catalog", "show", "llama", "v1").output)
    assert len(shown["shards"]) == 7

    assert lifeline("catalog", "promote", "llama", "prod", "v1", "--reason", "first").exit_code == 0
    assert lifeline("catalog", "promote", "llama", "prod", "v2").exit_code == 0
    refused = lifeline("catalog", "promote", "llama", "prod", "v3")
    assert refused.exit_code == 1
    assert "fingerprint_mismatch" in refused.output and "chat_template" in refused.output

    added = lifeline("catalog", "issue", "add", "llama", "v1", "--severity", "critical", "--title", "bad")
    assert added.exit_code == 0, added.output
    blocked = lifeline("catalog", "rollback", "llama", "prod", "--reason", "v2 regressed")
    assert blocked.exit_code == 1 and "critical_known_issue" in blocked.output
    assert lifeline("catalog", "issue", "resolve", "1", "--resolution", "false alarm").exit_code == 0
    back = lifeline("catalog", "rollback", "llama", "prod", "--reason", "v2 regressed")
    assert back.exit_code == 0, back.output
    assert "llama prod -> v1" in back.output

    assert lifeline("catalog", "verify", "llama", "v2").exit_code == 0
    shard = next(v2.glob("model-*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-1] + b"\xff")
    bad = lifeline("catalog", "verify", "llama", "v2")
    assert bad.exit_code == 1
    assert f"MISMATCH {shard.name}" in bad.output and "UNHEALTHY" in bad.output

    with session_scope(session_factory) as session:
        records = session.scalars(select(AuditRecord).order_by(AuditRecord.id)).all()
        audit = [(r.action, r.outcome) for r in records]
        actors = {r.actor for r in records}
    assert ("catalog.promote", "failed") in audit
    assert ("catalog.rollback", "succeeded") in audit
    assert len(actors) == 1 and actors.pop().startswith("cli:")

    exported = lifeline("controlplane", "events", "export", "--scope", "model:llama/alias:prod")
    kinds = [json.loads(line)["kind"] for line in exported.output.splitlines()]
    assert kinds == ["alias.promote", "alias.promote", "alias.rollback"]


def test_catalog_cli_rejects_bad_names_without_writing(lifeline: Any, tmp_path: Path) -> None:
    root = write_artifact(tmp_path / "v1")
    result = lifeline("catalog", "register", "llama", "bad name/with slash", str(root))
    assert result.exit_code == 2
    assert json.loads(lifeline("catalog", "list", "--json").output) == []
    bad_severity = lifeline("catalog", "issue", "add", "llama", "v1", "--severity", "meh", "--title", "t")
    assert bad_severity.exit_code == 2
