"""Broken artifact directories get a typed 422 (API) or a one-line error (CLI); nothing hangs or tracebacks.

Each case runs in a thread joined with a generous bound, so a regression
(a FIFO opened for reading blocks forever) fails the test instead of
hanging the suite.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from lifeline.cli import app
from tests.support.controlplane_testing import write_artifact

BASE = "/api/v1/catalog/models/llama"


def bounded(call: Callable[[], Any], limit_s: float = 60.0) -> Any:
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), "the call hung"
    return result[0]


def dangling(root: Path) -> None:
    (root / "extra.safetensors").symlink_to(root / "gone")


def loop(root: Path) -> None:
    (root / "a.bin").symlink_to(root / "b.bin")
    (root / "b.bin").symlink_to(root / "a.bin")


def fifo(root: Path) -> None:
    os.mkfifo(root / "model-pipe.safetensors")


def linked_dir(root: Path) -> None:
    (root / "sub").symlink_to(root.parent)


BREAKAGES = {"dangling_symlink": dangling, "symlink_loop": loop, "fifo": fifo, "symlinked_directory": linked_dir}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_register_of_a_directory_holding_a_non_regular_file_is_a_typed_422(
    client: TestClient, as_role: Any, tmp_path: Path, breakage: str
) -> None:
    root = write_artifact(tmp_path / "v1")
    BREAKAGES[breakage](root)
    response = bounded(lambda: client.post(f"{BASE}/versions", json={"version": "v1", "location": str(root)},
                                           headers=as_role("operator")))
    assert (response.status_code, response.json()["error"]["type"]) == (422, "invalid_artifact"), response.text
    assert client.get(f"{BASE}/versions/v1", headers=as_role("viewer")).status_code == 404


@pytest.mark.parametrize("breakage", ["fifo", "dangling_symlink"])
def test_verify_of_a_directory_that_gained_a_non_regular_file_is_a_typed_422(
    client: TestClient, as_role: Any, tmp_path: Path, breakage: str
) -> None:
    root = write_artifact(tmp_path / "v1")
    assert client.post(f"{BASE}/versions", json={"version": "v1", "location": str(root)},
                       headers=as_role("operator")).status_code == 201
    BREAKAGES[breakage](root)
    response = bounded(lambda: client.post(f"{BASE}/versions/v1/verify", json={}, headers=as_role("operator")))
    assert (response.status_code, response.json()["error"]["type"]) == (422, "invalid_artifact"), response.text


def test_bad_locations_are_typed_422_inside_and_outside_the_roots(client: TestClient, as_role: Any,
                                                                  tmp_path: Path) -> None:
    (tmp_path / "loop-a").symlink_to(tmp_path / "loop-b")
    (tmp_path / "loop-b").symlink_to(tmp_path / "loop-a")
    outside = Path("/tmp") / f"lifeline-loop-{os.getpid()}"
    outside.unlink(missing_ok=True)
    outside.symlink_to(outside)
    try:
        for location in (str(tmp_path / "loop-a"), str(outside), str(tmp_path / ("x" * 300)),
                         str(tmp_path / ("x" * 300) / "model")):
            response = bounded(lambda loc=location: client.post(
                f"{BASE}/versions", json={"version": "v1", "location": loc}, headers=as_role("operator")))
            assert (response.status_code, response.json()["error"]["type"]) == (422, "invalid_location"), location
    finally:
        outside.unlink()


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_cli_register_prints_the_error_without_a_traceback(
    database_url: str, session_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, breakage: str
) -> None:
    monkeypatch.setenv("LIFELINE_CONTROLPLANE_DATABASE_URL", database_url)
    root = write_artifact(tmp_path / "v1")
    BREAKAGES[breakage](root)
    result = bounded(lambda: CliRunner().invoke(app, ["catalog", "register", "llama", "v1", str(root)]))
    assert result.exit_code == 1, result.output
    assert "error: invalid_artifact:" in result.output
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
