"""The Redis token log's Lua scripts and `MemoryTokenLog` obey the one transition table, pair by pair.

Every (status, event) pair of `stream_status` is driven through the real Redis
on 127.0.0.1:6379 and through the memory log, and both must answer exactly
what the pure `transition()` says: allowed or refused, the status after, and
whether the request epoch moved.
"""

from __future__ import annotations

import itertools
import uuid

import pytest
import redis.asyncio as aioredis

from common.clock import ManualClock
from gateway.stream_status import InvalidTransition, StreamEvent, StreamStatus, advances_epoch, transition
from gateway.token_log import Frame, MemoryTokenLog
from gateway.token_log_redis import RedisTokenLog

REDIS_URL = "redis://127.0.0.1:6379/0"
PAIRS = list(itertools.product(StreamStatus, StreamEvent))


def _expected(status: StreamStatus, event: StreamEvent) -> tuple[bool, StreamStatus, int]:
    try:
        after = transition(status, event)
    except InvalidTransition:
        return False, status, 0
    return True, after, int(advances_epoch(status, event))


async def _drive(log, request_id: str, event: StreamEvent) -> bool:
    if event is StreamEvent.ADVANCE:
        return await log.advance_epoch(request_id, 5, owner="gw")
    if event is StreamEvent.CANCEL:
        return await log.cancel(request_id)
    return await log.apply(request_id, 5, event)


@pytest.fixture
async def redis_log():
    prefix = f"lifeline-test:{uuid.uuid4().hex[:10]}"
    client = aioredis.from_url(REDIS_URL, decode_responses=True)
    yield RedisTokenLog(client, prefix=prefix), client, prefix
    keys = [k async for k in client.scan_iter(f"{prefix}*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


@pytest.mark.parametrize(("status", "event"), PAIRS, ids=[f"{s}-{e}" for s, e in PAIRS])
async def test_redis_scripts_follow_the_transition_table(redis_log, status, event):
    log, client, _ = redis_log
    rid = f"r-{status}-{event}"
    await log.create(rid, {}, owner="gw")
    await client.hset(log._keys(rid)[0], mapping={"epoch": 5, "status": status.value})
    allowed, after, epoch_step = _expected(status, event)
    assert await _drive(log, rid, event) is allowed
    record = await log.get(rid)
    assert (record.status, record.epoch) == (after, 5 + epoch_step)
    appended = await log.append(rid, record.epoch, Frame(seq=0, kind="token", epoch=record.epoch))
    assert appended is not after.terminal  # frames go in only while the stream is not terminal


@pytest.mark.parametrize(("status", "event"), PAIRS, ids=[f"{s}-{e}" for s, e in PAIRS])
async def test_memory_log_follows_the_transition_table(status, event):
    log = MemoryTokenLog(clock=ManualClock())
    await log.create("r1", {}, owner="gw")
    stream = log._streams["r1"]
    stream.epoch, stream.status = 5, status
    allowed, after, epoch_step = _expected(status, event)
    assert await _drive(log, "r1", event) is allowed
    record = await log.get("r1")
    assert (record.status, record.epoch) == (after, 5 + epoch_step)
    appended = await log.append("r1", record.epoch, Frame(seq=0, kind="token", epoch=record.epoch))
    assert appended is not after.terminal

