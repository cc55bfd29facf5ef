"""Generations of the embedded registry never go back, even when the gateway restarts (invariant 1)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from common.clock import ManualClock
from contract.lease import Registration, StaleGeneration
from gateway.lease_registry import InMemoryLeaseRegistry

REG = Registration("eng-a", "http://127.0.0.1:9", "tiny-seed0")
TTL = timedelta(seconds=2)


async def test_generation_survives_a_gateway_restart_with_a_state_dir(tmp_path: Path):
    state = tmp_path / "registry" / "generations.json"
    before = InMemoryLeaseRegistry(TTL, ManualClock(), state_path=state)
    first = await before.register(REG)
    second = await before.register(REG)
    assert (first.generation, second.generation) == (1, 2)

    restarted = InMemoryLeaseRegistry(TTL, ManualClock(), state_path=state)  # same wall clock: only the file helps
    again = await restarted.register(REG)
    assert again.generation == 3
    with pytest.raises(StaleGeneration):  # the old process's late renewal is fenced in the new gateway
        await restarted.renew("eng-a", second.generation)
    assert json.loads(state.read_text()) == {"generations": {"eng-a": 3}}
    assert [p.name for p in state.parent.iterdir()] == ["generations.json"]  # no temporary file left behind


async def test_generation_survives_a_restart_without_a_state_dir():
    clock = ManualClock()
    before = InMemoryLeaseRegistry(TTL, clock)
    olds = [(await before.register(REG)).generation for _ in range(3)]
    assert olds == [olds[0], olds[0] + 1, olds[0] + 2]  # +1 within one process
    clock.advance(0.5)  # the restart takes at least a few milliseconds
    restarted = InMemoryLeaseRegistry(TTL, clock)
    assert (await restarted.register(REG)).generation > max(olds)


async def test_unreadable_counters_stop_start_up_naming_the_key(tmp_path: Path):
    state = tmp_path / "generations.json"
    state.write_text("{not json")
    with pytest.raises(ValueError, match="registry.state_dir"):
        InMemoryLeaseRegistry(TTL, ManualClock(), state_path=state)
