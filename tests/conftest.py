"""Fixtures shared by every test tier (built models, engine processes) and the tier markers.

A test's tier is its folder: tests/unit, tests/integration, tests/e2e and
tests/gpu mark their tests `unit`, `integration`, `e2e` and `gpu`. A test of
an interface's contract (tests/*/contract/, test_*_contract*.py: one side
writes, the other reads, on the real store) is also `contract`; `make
test-fast` runs `unit or contract`.

Under pytest-xdist each worker, and every process it starts, draws ports
from its own slice (common/ports.py), so parallel starters never race for one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from lifeline.processes import EngineProcess, built_model, free_port
from lifeline.vllm import VllmProcess

TIERS = ("unit", "integration", "e2e", "gpu")
TESTS = Path(__file__).parent


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ...
    if worker:
        os.environ["LIFELINE_PORT_SLICE"] = f"{int(worker.removeprefix('gw'))}/{os.environ['PYTEST_XDIST_WORKER_COUNT']}"


VLLM_FIXTURES = {"module_vllm_factory", "vllm_factory"}


def _schedule_rank(item: pytest.Item) -> int:
    """Longest first, so no worker is left with a long tail: real vLLM, then e2e, integration, unit."""
    if VLLM_FIXTURES & set(item.fixturenames):
        return 0
    return {"e2e": 1, "gpu": 1, "integration": 2, "unit": 3}[item.path.relative_to(TESTS).parts[0]]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.relative_to(TESTS).parts
        if parts[0] not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: a test lives under one of tests/{{{','.join(TIERS)}}}/")
        item.add_marker(parts[0])
        if "contract" in parts[1:-1] or "_contract" in item.path.stem:
            item.add_marker("contract")
        # pytest-xdist --dist loadgroup: the real vLLM servers' tests share one worker (two cores hold two
        # servers, not four); an e2e module stays on one worker, its module-scoped processes started once.
        if VLLM_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.xdist_group("vllm"))
        elif parts[0] == "e2e":
            item.add_marker(pytest.mark.xdist_group(item.path.relative_to(TESTS).as_posix()))
    items.sort(key=_schedule_rank)  # stable: a module's tests stay together, in file order


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
