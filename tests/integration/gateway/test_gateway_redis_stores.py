"""The Redis lease registry and Redis-streams token log against the real Redis on 127.0.0.1:6379."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
import redis.asyncio as aioredis

from contract.lease import LeaseExpired, Registration, RedisLeaseRegistry, StaleGeneration
from gateway.stream_status import StreamEvent, StreamStatus
from gateway.token_log import Frame
from gateway.token_log_redis import RedisTokenLog

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
async def client():
    prefix = f"lifeline-test:{uuid.uuid4().hex[:10]}"
    redis = aioredis.from_url(REDIS_URL, decode_responses=True)
    yield redis, prefix
    keys = [k async for k in redis.scan_iter(f"{prefix}*")]
    if keys:
        await redis.delete(*keys)
    await redis.aclose()


async def test_redis_registry_generations_and_expiry(client):
    redis, prefix = client
    ttl = timedelta(milliseconds=300)
    a = RedisLeaseRegistry(redis, region="r1", prefix=prefix, ttl=ttl)
    b = RedisLeaseRegistry(redis, region="r1", prefix=prefix, ttl=ttl)  # a second gateway replica sees the same leases
    reg = Registration("eng-a", "http://127.0.0.1:9", "v", "z1", "r1")
    first = await a.register(reg)
    second = await a.register(reg)
    assert second.generation == first.generation + 1
    assert [(lease.instance_id, lease.generation, lease.zone) for lease in await b.live()] == [("eng-a", second.generation, "z1")]
    with pytest.raises(StaleGeneration):
        await b.renew("eng-a", first.generation)
    await b.renew("eng-a", second.generation)
    await a.release("eng-a", first.generation)  # stale release: ignored
    assert len(await b.live()) == 1
    await asyncio.sleep(0.5)  # let the 300 ms lease lapse
    assert await b.live() == []
    with pytest.raises(LeaseExpired):
        await a.renew("eng-a", second.generation)
    assert (await a.register(reg)).generation == second.generation + 1


def _frame(seq: int, epoch: int, kind: str = "token") -> Frame:
    return Frame(seq=seq, kind=kind, epoch=epoch, token_ids=(100 + seq,), text=f"t{seq}", instance="eng-a")


async def test_redis_token_log_fences_epochs_and_replays_after_seq(client):
    redis, prefix = client
    log = RedisTokenLog(redis, prefix=prefix, owner_ttl=timedelta(milliseconds=300))
    other = RedisTokenLog(redis, prefix=prefix, owner_ttl=timedelta(milliseconds=300))
    await log.create("r1", {"prompt_ids": [1, 2]}, owner="gw-1")
    for seq in range(3):
        assert await log.append("r1", 0, _frame(seq, 0))
    assert await log.advance_epoch("r1", 0, owner="gw-1")
    assert not await log.append("r1", 0, _frame(3, 0))  # the old epoch's late frame
    assert await log.append("r1", 1, _frame(3, 1))
    record = await other.get("r1")
    assert record.epoch == 1 and record.status is StreamStatus.ACTIVE and record.request == {"prompt_ids": [1, 2]}
    assert [f.seq for f in await other.frames_after("r1", 1)] == [2, 3]
    assert (await other.frames_after("r1", -1))[0] == _frame(0, 0)
    assert await other.owner("r1") == "gw-1"
    await asyncio.sleep(0.4)
    assert await other.owner("r1") is None  # gw-1 stopped heart-beating: another replica may take over
    assert not await other.advance_epoch("r1", 0, owner="gw-2")
    assert await other.advance_epoch("r1", 1, owner="gw-2")
    assert not await log.refresh_owner("r1", "gw-1", 1)


async def test_redis_wait_frames_sees_frames_appended_later(client):
    redis, prefix = client
    log = RedisTokenLog(redis, prefix=prefix)
    await log.create("r2", {}, owner="gw-1")
    await log.append("r2", 0, _frame(0, 0))

    async def later() -> None:
        await asyncio.sleep(0.1)
        await log.append("r2", 0, _frame(1, 0))

    task = asyncio.create_task(later())
    frames = await log.wait_frames("r2", 0, timeout=5)
    await task
    assert [f.seq for f in frames] == [1]


async def test_redis_cancel_wins_and_terminal_states_are_idempotent(client):
    redis, prefix = client
    log = RedisTokenLog(redis, prefix=prefix)
    await log.create("r3", {}, owner="gw-1")
    assert await log.apply("r3", 0, StreamEvent.FINISH)
    assert await log.apply("r3", 0, StreamEvent.FINISH)
    assert not await log.cancel("r3")  # finished stays finished
    await log.create("r4", {}, owner="gw-1")
    assert await log.cancel("r4") and await log.cancel("r4")
    assert not await log.advance_epoch("r4", 1, owner="gw-1")
    assert (await log.get("r4")).status is StreamStatus.CANCELLED


async def test_redis_token_log_keeps_the_migration_count_for_every_replica(client):
    redis, prefix = client
    one = RedisTokenLog(redis, prefix=prefix)
    two = RedisTokenLog(redis, prefix=prefix)  # another gateway replica
    await one.create("r1", {"prompt_ids": [1]}, owner="gw-1")
    assert (await two.get("r1")).migrations == 0
    assert await one.advance_epoch("r1", 0, owner="gw-1", migration=True)  # engine failed under replica one
    assert await two.advance_epoch("r1", 1, owner="gw-2")  # the client resumed on replica two
    assert not await one.advance_epoch("r1", 1, owner="gw-1", migration=True)  # replica one is fenced: no count
    assert await two.advance_epoch("r1", 2, owner="gw-2", migration=True)
    record = await one.get("r1")
    assert (record.epoch, record.migrations) == (3, 2)
    await redis.hdel(f"{prefix}:{{r1}}:meta", "migrations")  # a record written before the count existed
    assert (await two.get("r1")).migrations == 0
