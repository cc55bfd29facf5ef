"""Fixtures shared by every test tier: built models and engine processes."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

from tests.support.engine_process import EngineProcess

# Models are deterministic, so one build per preset and seed serves the whole run.
MODEL_CACHE = Path(os.environ.get("LIFELINE_TEST_MODEL_CACHE", Path(__file__).parent.parent / ".lifeline" / "test-models"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def built_model(preset: str, seed: int) -> Path:
    from engine.model_build import build_model

    target = MODEL_CACHE / f"{preset}-seed{seed}"
    if not (target / "model.safetensors.index.json").exists():
        partial = target.with_name(target.name + f".partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        build_model(partial, preset_name=preset, seed=seed)
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
    return target


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return built_model("tiny", 0)


@pytest.fixture
def engine_factory(tiny_model: Path, tmp_path: Path):
    """Start real `lifeline engine serve` processes; every one is killed at teardown."""
    started: list[EngineProcess] = []

    def start(instance_id: str = "engine-a", *, model: Path | None = None, extra_args: list[str] | None = None,
              state_dir: Path | None = None, wait_ready: bool = True) -> EngineProcess:
        process = EngineProcess(
            model=model or tiny_model,
            port=free_port(),
            instance_id=instance_id,
            state_dir=state_dir or tmp_path / "state" / instance_id,
            log_path=tmp_path / f"{instance_id}-{len(started)}.log",
            extra_args=extra_args or [],
        )
        started.append(process)
        process.start()
        if wait_ready:
            process.wait_ready()
        return process

    yield start
    for process in started:
        process.kill()
