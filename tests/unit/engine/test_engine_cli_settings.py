"""`lifeline engine serve` settings: flags beat `LIFELINE_ENGINE_*`, which beat the one set of defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from engine.cli import engine_app
from engine.settings import EngineSettings, FaultSettings

# Mounted as `lifeline engine` mounts it (a lone command would collapse into the app).
cli = typer.Typer()
cli.add_typer(engine_app, name="engine")


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[tuple[EngineSettings, FaultSettings]]:
    import engine.server

    seen: list[tuple[EngineSettings, FaultSettings]] = []
    monkeypatch.setattr(engine.server, "run_server", lambda settings, faults: seen.append((settings, faults)))
    monkeypatch.setattr("common.logs.configure_logging", lambda *a, **k: None)
    for name in ("PORT", "ZONE", "MODEL", "MAX_NUM_SEQS", "FAULT_TOKEN_DELAY_MS"):
        monkeypatch.delenv(f"LIFELINE_ENGINE_{name}", raising=False)
    return seen


def test_environment_variables_reach_the_settings(captured, tiny_model: Path) -> None:
    env = {"LIFELINE_ENGINE_PORT": "9123", "LIFELINE_ENGINE_ZONE": "zone-b", "LIFELINE_ENGINE_MODEL": str(tiny_model),
           "LIFELINE_ENGINE_FAULT_TOKEN_DELAY_MS": "7"}
    result = CliRunner().invoke(cli, ["engine", "serve"], env=env)
    assert result.exit_code == 0, result.output
    settings, faults = captured[0]
    assert (settings.port, settings.zone, settings.model) == (9123, "zone-b", tiny_model)
    assert faults.token_delay_ms == 7.0


def test_flags_beat_the_environment_and_defaults_come_from_settings(captured, tiny_model: Path) -> None:
    result = CliRunner().invoke(cli, ["engine", "serve", "--model", str(tiny_model), "--port", "9200",
                                             "--enable-fault-admin"], env={"LIFELINE_ENGINE_PORT": "9123"})
    assert result.exit_code == 0, result.output
    settings, faults = captured[0]
    assert settings.port == 9200 and settings.enable_fault_admin is True
    assert settings.max_num_seqs == EngineSettings.model_fields["max_num_seqs"].default
    assert faults == FaultSettings()


def test_missing_model_names_the_key(captured) -> None:
    result = CliRunner().invoke(cli, ["engine", "serve"])
    assert result.exit_code != 0 and "model" in result.output and not captured


def test_step_stall_bound_and_stall_fault_come_from_the_environment_and_flags(captured, tiny_model: Path) -> None:
    env = {"LIFELINE_ENGINE_MODEL": str(tiny_model), "LIFELINE_ENGINE_STEP_STALL_BOUND": "2.5"}
    result = CliRunner().invoke(cli, ["engine", "serve", "--fault-stall-step-after-tokens", "3"], env=env)
    assert result.exit_code == 0, result.output
    settings, faults = captured[0]
    assert settings.step_stall_bound.total_seconds() == 2.5 and faults.stall_step_after_tokens == 3


def test_a_step_stall_bound_of_zero_stops_start_up_naming_the_key(captured, tiny_model: Path) -> None:
    result = CliRunner().invoke(cli, ["engine", "serve", "--model", str(tiny_model), "--step-stall-bound", "0"])
    assert result.exit_code != 0 and "step_stall_bound" in result.output and not captured
