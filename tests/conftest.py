"""Fixtures shared by every test tier (built models, engine processes), the tier markers and the parallel schedule.

A test's tier is its folder: tests/unit, tests/integration, tests/e2e and
tests/gpu mark their tests `unit`, `integration`, `e2e` and `gpu`. A test of
an interface's contract (tests/*/contract/, test_*_contract*.py: one side
writes, the other reads, on the real store) is also `contract`; `make
test-fast` runs `unit or contract`.

Under pytest-xdist (`make test`) a module is one unit of work, so its
module-scoped processes start once, and tests/e2e/vllm — every test that
starts real vLLM — is one unit: two cores hold two vLLM servers, not four.
The longest units go first (a module of minutes carries `pytestmark =
pytest.mark.long`). Each worker, and every process it starts, draws
ports from its own slice (common/ports.py), so parallel starters never race
for one. docs/testing.md has the tiers' times.
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
VLLM_TESTS = "tests/e2e/vllm"  # every test that starts real vLLM, and nothing else
VLLM_FIXTURE = "module_vllm_factory"  # the one way a test starts vLLM servers of its own


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ...
    if worker:
        os.environ["LIFELINE_PORT_SLICE"] = f"{int(worker.removeprefix('gw'))}/{os.environ['PYTEST_XDIST_WORKER_COUNT']}"


def work_unit(nodeid: str) -> str:
    """What one xdist worker runs as a whole: tests/e2e/vllm, or else the test's module."""
    module = nodeid.split("::", 1)[0]
    return VLLM_TESTS if module.startswith(VLLM_TESTS + "/") else module


def _schedule_rank(item: pytest.Item) -> tuple[int, int]:
    """Longest first, so no worker is left with a long tail: real vLLM, then e2e, integration, unit; within a
    tier, the modules marked `long` (pytestmark) first. xdist hands out work units in this order, one at a time."""
    if work_unit(item.nodeid) == VLLM_TESTS:
        return 0, 0
    tier = {"e2e": 1, "gpu": 1, "integration": 2, "unit": 3}[item.path.relative_to(TESTS).parts[0]]
    return tier, 0 if item.get_closest_marker("long") else 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.relative_to(TESTS).parts
        if parts[0] not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: a test lives under one of tests/{{{','.join(TIERS)}}}/")
        item.add_marker(parts[0])
        if "contract" in parts[1:-1] or "_contract" in item.path.stem:
            item.add_marker("contract")
        if VLLM_FIXTURE in item.fixturenames and work_unit(item.nodeid) != VLLM_TESTS:
            raise pytest.UsageError(f"{item.nodeid} starts real vLLM: it belongs in {VLLM_TESTS}/")
    items.sort(key=_schedule_rank)  # stable: a module's tests stay together, in file order


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's load-by-scope scheduler, with `work_unit` as the scope (its own `loadgroup` marks are
    lost on pytest 9.2, whose node ids it can no longer rewrite)."""
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return WorkUnitScheduling(config, log)


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
