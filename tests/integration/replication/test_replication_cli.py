"""`lifeline replication policy set|list|show` and `status` on the real database: audited, evented, typed refusals."""

from __future__ import annotations

import json

from sqlalchemy import select
from typer.testing import CliRunner

from controlplane.auth.models import AuditRecord
from controlplane.db import session_scope
from controlplane.event.models import Event
from controlplane.replication.cli import replication_app

DESTINATION = "redis://:hunter2@127.0.0.1:6379/0?key_prefix=standby:"


def test_the_cli_sets_lists_shows_and_refuses_like_the_api(database_url, session_factory, monkeypatch):
    monkeypatch.setenv("LIFELINE_CONTROLPLANE_DATABASE_URL", database_url)
    runner = CliRunner()

    def cli(*args: str):
        return runner.invoke(replication_app, list(args), catch_exceptions=False)

    base = ["policy", "set", "tiny", "chat", "--mode", "critical", "--rpo-context-seconds", "30", "--reason", "chat",
            "--source", "/var/kv/primary", "--destination", DESTINATION]
    created = cli(*base)
    assert created.exit_code == 0, created.output
    assert "r1: critical" in created.output and "hunter2" not in created.output
    conflict = cli(*base, "--expected-revision", "3")
    assert conflict.exit_code == 1 and "replication_policy_conflict" in conflict.output
    refused = cli(*base[:4], "--mode", "interactive", *base[6:])
    assert refused.exit_code == 2 and "needs every_turns or every_seconds" in refused.output

    shown = json.loads(cli("policy", "show", "tiny", "chat").output)
    assert (shown["revision"], shown["mode"], shown["updated_by"][:4]) == (1, "critical", "cli:")
    assert "hunter2" not in cli("policy", "list", "--json").output
    status = json.loads(cli("status", "--json").output)
    assert [(p["session_class"], p["pending"]) for p in status["policies"]] == [("chat", 0)]
    missing = cli("policy", "show", "tiny", "nothing")
    assert missing.exit_code == 1 and "replication_policy_not_found" in missing.output

    with session_scope(session_factory) as session:
        audits = [(a.action, a.outcome) for a in session.scalars(select(AuditRecord).order_by(AuditRecord.id))]
        kinds = [e.kind for e in session.scalars(select(Event))]
    assert audits == [("replication.policy.set", "succeeded"), ("replication.policy.set", "failed"),
                      ("replication.policy.set", "failed")]
    assert kinds == ["replication.policy"]
