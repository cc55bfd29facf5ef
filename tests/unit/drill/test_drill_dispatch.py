"""The composition root wires API-requested drill runs to the Celery task (eager without a broker)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controlplane.app import create_app
from controlplane.config import ControlPlaneSettings


def test_without_a_fleet_file_runs_stay_scheduled(tmp_path: Path) -> None:
    app = create_app(ControlPlaneSettings(data_dir=tmp_path))
    assert app.state.drill_dispatch is None


def test_with_a_fleet_file_a_run_goes_through_the_celery_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from controlplane.drill import fleet, tasks

    calls: list[tuple[int, Any]] = []
    monkeypatch.setattr(fleet.FileFleet, "load", classmethod(lambda cls, path: _Fleet(path)))
    monkeypatch.setattr(tasks, "run", lambda factory, run_id, **kwargs: calls.append((run_id, kwargs["fleet"])) or "passed")
    fleet_file = tmp_path / "fleet.json"
    app = create_app(ControlPlaneSettings(data_dir=tmp_path, drill_fleet_file=fleet_file))
    app.state.drill_dispatch(7)
    assert [(run_id, f.path) for run_id, f in calls] == [(7, fleet_file)]


class _Fleet:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.spec = type("Spec", (), {"events": None})()
