from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import inspect

from controlplane.db import build_engine
from controlplane.schema import downgrade, metadata, upgrade

from tests.support.controlplane_testing import throwaway_database


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


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_each_database_gets_its_own_epoch_and_a_downgrade_forgets_it(backend: str, tmp_path: Path) -> None:
    """Migration 0011: snapshot versions compare only within an epoch, so two databases must never share one."""
    import uuid

    def epoch_and_columns(url: str) -> tuple[str | None, set[str]]:
        engine = build_engine(url)
        try:
            with engine.connect() as conn:
                epoch = conn.exec_driver_sql("SELECT epoch FROM snapshot_counter WHERE id = 1").scalar()
                columns = {c["name"] for c in inspect(conn).get_columns("gateway_reports")}
            return epoch, columns
        finally:
            engine.dispose()

    with throwaway_database(backend, tmp_path) as first, throwaway_database(backend, tmp_path) as second:
        upgrade(first)
        upgrade(second)
        epoch_a, columns = epoch_and_columns(first)
        epoch_b, _ = epoch_and_columns(second)
        assert uuid.UUID(epoch_a) and uuid.UUID(epoch_b) and epoch_a != epoch_b
        assert "snapshot_epoch" in columns
        upgrade(first)  # at head: a no-op keeps the epoch
        assert epoch_and_columns(first)[0] == epoch_a

        downgrade(first, "0010")
        engine = build_engine(first)
        try:
            with engine.connect() as conn:
                assert "epoch" not in {c["name"] for c in inspect(conn).get_columns("snapshot_counter")}
                assert "snapshot_epoch" not in {c["name"] for c in inspect(conn).get_columns("gateway_reports")}
                assert conn.exec_driver_sql("SELECT version FROM snapshot_counter WHERE id = 1").scalar() == 0
        finally:
            engine.dispose()
        upgrade(first)
        again, _ = epoch_and_columns(first)
        assert again and again != epoch_a  # forgotten and made anew: consumers take it as another database


def test_epoch_rotate_gives_a_restored_database_a_new_epoch_and_an_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from typer.testing import CliRunner

    from lifeline.cli import app

    monkeypatch.setenv("LIFELINE_CONTROLPLANE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("LIFELINE_CONTROLPLANE_DATABASE_URL", raising=False)
    runner = CliRunner()
    assert runner.invoke(app, ["controlplane", "migrate"], catch_exceptions=False).exit_code == 0
    shown = runner.invoke(app, ["controlplane", "epoch", "show"], catch_exceptions=False)
    assert shown.exit_code == 0
    _, before, _, version = shown.stdout.split()
    assert version == "0"

    refused = runner.invoke(app, ["controlplane", "epoch", "rotate", "--reason", " "])
    assert refused.exit_code == 2 and "reason" in refused.output
    assert runner.invoke(app, ["controlplane", "epoch", "show"]).stdout.split()[1] == before  # changed nothing

    rotated = runner.invoke(app, ["controlplane", "epoch", "rotate", "--reason", "restored from backup"],
                            catch_exceptions=False)
    assert rotated.exit_code == 0 and before in rotated.stdout
    _, after, _, version = runner.invoke(app, ["controlplane", "epoch", "show"]).stdout.split()
    assert after != before and version == "1"
    exported = runner.invoke(app, ["controlplane", "events", "export", "--kind", "controlplane.epoch_rotated"])
    [event] = [json.loads(line) for line in exported.stdout.splitlines()]
    assert (event["before"], event["after"], event["reason"], event["routing_tier"]) == (
        {"epoch": before}, {"epoch": after}, "restored from backup", "l7")
    assert event["actor"].startswith("cli:")


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
@pytest.mark.parametrize(("fault", "before"), [("sigstop", "0019"), ("bad_version", "0020")])
def test_a_new_fault_comes_with_its_migration_and_existing_runs_keep_their_definition(
        backend: str, fault: str, before: str, tmp_path: Path) -> None:
    from sqlalchemy.exc import IntegrityError

    from common.clock import SystemClock
    from controlplane.db import build_session_factory, session_scope
    from controlplane.drill import service
    from controlplane.drill.schemas import DrillSpec

    def define(kind: str) -> int:
        spec = DrillSpec.model_validate({"name": f"drill-{kind}", "model": "tiny", "scope": "instance",
                                         "fault": kind, "blast_radius": {"region": "local", "instances": ["v"]}})
        with session_scope(factory) as session:
            definition = service.define(session, spec=spec, actor="test", clock=SystemClock())
            return service.create_run(session, definition=definition, trigger="manual", actor="test",
                                      clock=SystemClock()).id

    with throwaway_database(backend, tmp_path) as url:
        upgrade(url, before)
        engine = build_engine(url)
        factory = build_session_factory(engine)
        try:
            with pytest.raises(IntegrityError):
                define(fault)
            kill_run = define("sigkill")  # a run whose definition the upgrade rebuilds under it
            upgrade(url)
            define(fault)
            with session_scope(factory) as session:
                assert service.get_run_or_raise(session, run_id=kill_run).definition.fault == "sigkill"
            with pytest.raises(RuntimeError, match=f"inject {fault}"):
                downgrade(url, before)
            with engine.begin() as conn:
                conn.exec_driver_sql("DELETE FROM drill_runs WHERE definition_id IN "
                                     f"(SELECT id FROM drill_definitions WHERE fault = '{fault}')")
                conn.exec_driver_sql(f"DELETE FROM drill_definitions WHERE fault = '{fault}'")
            downgrade(url, before)
            with pytest.raises(IntegrityError):
                define(fault)
            with session_scope(factory) as session:
                assert service.get_run_or_raise(session, run_id=kill_run).definition.fault == "sigkill"
        finally:
            engine.dispose()
