"""Holders and engines for the holder's end-to-end tests: real processes, killed with SIGKILL."""

from __future__ import annotations

import json
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from common import oneshot_http
from contract.standby import StandbyPrime
from engine.standby import StandbyEngine
from holder.process import HolderProcess
from lifeline.processes import EngineProcess, built_model, free_port

PROMPT = "The standby region takes over when"


class Fleet:
    """Holders and engines of one test (or module), all SIGKILLed and their shm dirs removed at the end."""

    def __init__(self, workdir: Path, model: Path) -> None:
        self.workdir = workdir
        self.model = model
        self.holders: list[HolderProcess] = []
        self.engines: list[EngineProcess] = []
        self.standbys: list[StandbyEngine] = []
        self.shm_dir = Path("/dev/shm") / f"lifeline-test-{workdir.name}-{time.monotonic_ns()}"

    def start_holder(self, *, port: int | None = None, extra_args: list[str] | None = None) -> HolderProcess:
        holder = HolderProcess(self.model, port or free_port(), self.workdir / "holder-state", self.shm_dir,
                               self.workdir / f"holder-{len(self.holders)}.log", extra_args=extra_args or [])
        self.holders.append(holder)
        holder.start()
        holder.wait_ready()
        return holder

    def start_engine(self, instance_id: str, extra_args: list[str] | None = None, *, wait: bool = True) -> EngineProcess:
        engine = EngineProcess(self.model, free_port(), instance_id, self.workdir / "state" / instance_id,
                               self.workdir / f"{instance_id}-{len(self.engines)}.log", extra_args=extra_args or [])
        self.engines.append(engine)
        engine.start()
        if wait:
            engine.wait_ready()
        return engine

    def start_standby(self, *, warm: bool = True, prime: StandbyPrime | None = None) -> StandbyEngine:
        """A standby engine process, as a supervisor keeps one; `warm` waits until its imports (and its
        priming, with `prime`) are done."""
        index = len(self.standbys)
        standby = StandbyEngine(self.workdir / f"standby-{index}.log", self.workdir / f"standby-{index}.ready",
                                torch_threads=1, prime=prime)
        self.standbys.append(standby)
        standby.spawn()
        if warm:
            wait_for(lambda: standby.warm or not standby.alive, "the standby to warm up", timeout=120)
            assert standby.warm, standby.log_path.read_text()[-3000:]
        return standby

    def activate(self, standby: StandbyEngine, instance_id: str, extra_args: list[str] | None = None) -> EngineProcess:
        """Restart `instance_id` as a supervisor would: activate the standby, or start cold if it is dead."""
        engine = EngineProcess(self.model, free_port(), instance_id, self.workdir / "state" / instance_id,
                               standby.log_path, extra_args=extra_args or [])
        self.engines.append(engine)
        process = standby.activate(["--model", str(engine.model), "--port", str(engine.port),
                                    "--instance-id", instance_id, "--state-dir", str(engine.state_dir),
                                    "--torch-threads", "1", *engine.extra_args])
        if process is None:
            engine.start()
        else:
            engine.process = process
        engine.wait_ready()
        return engine

    def close(self) -> None:
        for standby in self.standbys:
            standby.close()
        for engine in self.engines:
            engine.kill()
        for holder in self.holders:
            holder.kill()
        shutil.rmtree(self.shm_dir, ignore_errors=True)


@pytest.fixture
def fleet_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], Fleet]]:
    fleets: list[Fleet] = []

    def make() -> Fleet:
        fleet = Fleet(tmp_path_factory.mktemp("fleet"), built_model("tiny", 0))
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        fleet.close()


def completion_tokens(engine_url: str, prompt: str | list[int], max_tokens: int, **extra: Any) -> list[int]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "return_token_ids": True, **extra}
    response = oneshot_http.post(f"{engine_url}/v1/completions", json=body, timeout=120)
    response.raise_for_status()
    return response.json()["choices"][0]["token_ids"]


def kill_mid_stream(engine: EngineProcess, prompt: str, max_tokens: int, *, after: int) -> list[int]:
    """Stream a greedy completion from `engine` and SIGKILL it once `after` tokens arrived; the tokens it sent."""
    committed: list[int] = []
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True, "stream": True,
            "return_token_ids": True}
    with oneshot_http.stream("POST", f"{engine.url}/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                committed.extend(json.loads(line[6:])["choices"][0].get("token_ids") or [])
            if len(committed) >= after:
                engine.kill(signal.SIGKILL)
                break
    return committed


def prompt_ids(engine_url: str, prompt: str) -> list[int]:
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0.0, "return_token_ids": True}
    response = oneshot_http.post(f"{engine_url}/v1/completions", json=body, timeout=120)
    response.raise_for_status()
    return response.json()["choices"][0]["prompt_token_ids"]


def weights_origin(engine: EngineProcess) -> dict[str, Any]:
    return oneshot_http.get(f"{engine.url}/healthz/weights", timeout=5).json()


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
