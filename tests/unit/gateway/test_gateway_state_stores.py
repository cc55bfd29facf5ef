"""The in-memory lease registry and token log on virtual time: generations, fencing, CAS."""

from __future__ import annotations

from datetime import timedelta

import pytest

from common.clock import ManualClock
from contract.lease import LeaseExpired, Registration, StaleGeneration
from gateway.lease_registry import InMemoryLeaseRegistry
from gateway.stream_status import StreamEvent, StreamStatus
from gateway.token_log import Frame, MemoryTokenLog

REG = Registration("eng-a", "http://127.0.0.1:9", "tiny-seed0")


async def test_each_registration_gets_a_higher_generation_and_old_ones_are_rejected():
    clock = ManualClock()
    registry = InMemoryLeaseRegistry(timedelta(seconds=2), clock)
    first = await registry.register(REG)
    second = await registry.register(REG)
    assert second.generation == first.generation + 1
    with pytest.raises(StaleGeneration):
        await registry.renew("eng-a", first.generation)
    assert [lease.generation for lease in await registry.live()] == [second.generation]
    await registry.release("eng-a", first.generation)  # a stale release changes nothing
    assert len(await registry.live()) == 1


async def test_lapsed_lease_leaves_routing_within_the_ttl_and_cannot_be_renewed():
    clock = ManualClock()
    registry = InMemoryLeaseRegistry(timedelta(seconds=2), clock)
    lease = await registry.register(REG)
    clock.advance(1.5)
    await registry.renew("eng-a", lease.generation)
    clock.advance(1.9)
    assert len(await registry.live()) == 1
    clock.advance(0.2)
    assert await registry.live() == []
    with pytest.raises(LeaseExpired):
        await registry.renew("eng-a", lease.generation)
    again = await registry.register(REG)
    assert again.generation == lease.generation + 1


def _frame(seq: int, epoch: int) -> Frame:
    return Frame(seq=seq, kind="token", epoch=epoch, token_ids=(seq,), text=str(seq))


async def test_frames_from_an_older_epoch_are_fenced_off():
    log = MemoryTokenLog(clock=ManualClock())
    await log.create("r1", {"x": 1}, owner="gw")
    assert await log.append("r1", 0, _frame(0, 0))
    assert await log.advance_epoch("r1", 0, owner="gw")
    assert not await log.append("r1", 0, _frame(1, 0))  # the late frame of the engine we left
    assert await log.append("r1", 1, _frame(1, 1))
    assert [f.seq for f in await log.frames_after("r1", -1)] == [0, 1]
    assert [f.seq for f in await log.frames_after("r1", 0)] == [1]
    assert not await log.advance_epoch("r1", 0, owner="gw")  # CAS with a stale expectation fails


async def test_cancel_wins_over_a_late_migration_and_terminal_states_are_idempotent():
    log = MemoryTokenLog(clock=ManualClock())
    await log.create("r1", {}, owner="gw")
    assert await log.cancel("r1")
    assert await log.cancel("r1")  # again: same answer, nothing changes
    record = await log.get("r1")
    assert record.status is StreamStatus.CANCELLED and record.epoch == 1
    assert not await log.advance_epoch("r1", 1, owner="gw")
    assert not await log.append("r1", 1, _frame(0, 1))
    assert not await log.apply("r1", 1, StreamEvent.FINISH)
    assert await log.cancel("r1")


async def test_owner_lapses_so_another_replica_can_take_over():
    clock = ManualClock()
    log = MemoryTokenLog(owner_ttl=timedelta(seconds=1), clock=clock)
    await log.create("r1", {}, owner="gw-1")
    assert await log.owner("r1") == "gw-1"
    clock.advance(1.1)
    assert await log.owner("r1") is None
    assert await log.advance_epoch("r1", 0, owner="gw-2")
    assert await log.owner("r1") == "gw-2"


async def test_the_migration_count_lives_in_the_log_and_only_migrations_raise_it():
    log = MemoryTokenLog(clock=ManualClock())
    await log.create("r1", {}, owner="gw-1")
    assert (await log.get("r1")).migrations == 0
    assert await log.advance_epoch("r1", 0, owner="gw-1", migration=True)  # engine failed: moved
    assert await log.advance_epoch("r1", 1, owner="gw-2")  # a client resume: new epoch, same count
    assert not await log.advance_epoch("r1", 1, owner="gw-1", migration=True)  # fenced off: counts nothing
    assert await log.advance_epoch("r1", 2, owner="gw-2", migration=True)
    record = await log.get("r1")
    assert (record.epoch, record.migrations) == (3, 2)
