from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import inspect

from controlplane.db import build_engine
from controlplane.schema import downgrade, metadata, upgrade

from tests.support.controlplane_testing import throwaway_database

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migrations_upgrade_empty_database_to_head_and_back(backend: str, tmp_path: Path) -> None:
    with throwaway_database(backend, tmp_path) as url:
        upgrade(url)
        engine = build_engine(url)
        try:
            with engine.connect() as conn:
                tables = set(inspect(conn).get_table_names())
                counter = conn.exec_driver_sql("SELECT version FROM snapshot_counter WHERE id = 1").scalar()
            assert set(metadata().tables) <= tables
            assert counter == 0
            downgrade(url)
            with engine.connect() as conn:
                assert set(inspect(conn).get_table_names()) <= {"alembic_version"}
            upgrade(url)
            with engine.connect() as conn:
                assert set(metadata().tables) <= set(inspect(conn).get_table_names())
        finally:
            engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_append_only_triggers_come_and_go_with_their_migration(backend: str, tmp_path: Path) -> None:
    from sqlalchemy import text
    from sqlalchemy.exc import IntegrityError

    insert = text(
        "INSERT INTO events (kind, actor, reason, scope, outcome, started_at, ended_at) "
        "VALUES ('k', 'a', 'r', 's', 'succeeded', :at, :at)"
    )
    at = {"at": datetime(2026, 1, 1, tzinfo=UTC)}
    with throwaway_database(backend, tmp_path) as url:
        upgrade(url)
        engine = build_engine(url)
        try:
            with engine.begin() as conn:
                conn.execute(insert, at)
            with pytest.raises(IntegrityError), engine.begin() as conn:
                conn.execute(text("UPDATE events SET reason = 'x'"))
            downgrade(url, "0002")
            with engine.begin() as conn:
                conn.execute(text("UPDATE events SET reason = 'x'"))
                conn.execute(text("DELETE FROM events"))
            upgrade(url)
            with engine.begin() as conn:
                conn.execute(insert, at)
            with pytest.raises(IntegrityError), engine.begin() as conn:
                conn.execute(text("DELETE FROM events"))
            downgrade(url)  # all the way down, through the triggers, with a row in place
            with engine.connect() as conn:
                assert set(inspect(conn).get_table_names()) <= {"alembic_version"}
        finally:
            engine.dispose()


def test_migrate_command_works_from_any_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from lifeline.cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LIFELINE_CONTROLPLANE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("LIFELINE_CONTROLPLANE_DATABASE_URL", raising=False)
    result = CliRunner().invoke(app, ["controlplane", "migrate"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    token = CliRunner().invoke(app, ["controlplane", "token", "create", "--role", "admin"], catch_exceptions=False)
    assert token.exit_code == 0
    assert token.stdout.strip().splitlines()[0].startswith("llt_")
    assert (tmp_path / "data" / "controlplane.sqlite3").is_file()
    bad = CliRunner().invoke(app, ["controlplane", "token", "create", "--role", "root"])
    assert bad.exit_code == 2
