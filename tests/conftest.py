"""Fixtures shared by every test tier: built models and engine processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lifeline.processes import EngineProcess, built_model, free_port
from lifeline.vllm import VllmProcess


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return built_model("tiny", 0)


class EngineStarter:
    """Starts real `lifeline engine serve` processes and kills every one on close."""

    def __init__(self, model: Path, workdir: Path) -> None:
        self.model = model
        self.workdir = workdir
        self.started: list[EngineProcess] = []

    def __call__(self, instance_id: str = "engine-a", *, model: Path | None = None,
                 extra_args: list[str] | None = None, state_dir: Path | None = None,
                 wait_ready: bool = True) -> EngineProcess:
        process = EngineProcess(
            model=model or self.model,
            port=free_port(),
            instance_id=instance_id,
            state_dir=state_dir or self.workdir / "state" / instance_id,
            log_path=self.workdir / f"{instance_id}-{len(self.started)}.log",
            extra_args=extra_args or [],
        )
        self.started.append(process)
        process.start()
        if wait_ready:
            process.wait_ready()
        return process

    def close(self) -> None:
        for process in self.started:
            process.kill()


@pytest.fixture
def engine_factory(tiny_model: Path, tmp_path: Path):
    """Engines for one test; each is SIGKILLed at teardown."""
    starter = EngineStarter(tiny_model, tmp_path)
    yield starter
    starter.close()


@pytest.fixture(scope="module")
def module_engine_factory(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """Engines shared by the tests of one module (start-up costs seconds)."""
    starter = EngineStarter(tiny_model, tmp_path_factory.mktemp("engines"))
    yield starter
    starter.close()


class VllmStarter:
    """Starts real vLLM servers (`lifeline.vllm`) on the tiny model and stops every one on close."""

    def __init__(self, model: Path, workdir: Path) -> None:
        self.model = model
        self.workdir = workdir
        self.started: list[VllmProcess] = []

    def __call__(self, served_model_name: str = "tiny", *, model: Path | None = None, wait_ready: bool = True,
                 **options: Any) -> VllmProcess:
        process = VllmProcess(model=model or self.model, port=free_port(), served_model_name=served_model_name,
                              log_path=self.workdir / f"vllm-{len(self.started)}.log", **options)
        self.started.append(process)
        process.start()
        if wait_ready:
            process.wait_ready()
        return process

    def close(self) -> None:
        for process in self.started:
            process.stop()


@pytest.fixture(scope="module")
def module_vllm_factory(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """Real vLLM servers shared by the tests of one module: a start costs 20-60 s, and two fit this machine."""
    starter = VllmStarter(tiny_model, tmp_path_factory.mktemp("vllm"))
    yield starter
    starter.close()
