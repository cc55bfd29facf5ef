"""The committed-token log on Redis streams, for several gateway replicas.

Per stream three keys in one hash slot: `{prefix}:{<request_id>}:meta` (request,
epoch, status, migrations), `…:frames` (a stream with explicit ids
`<seq+1>-0`, so "after seq N" is a plain XRANGE / XREAD from `<N+1>-0`) and
`…:owner` (the driving replica, with a TTL). Every change of epoch or status
is one Lua script, built on the transition table of `stream_status`.

Frames are contiguous: an append is refused unless the previous seq is there.
Every script is safe to send again after an answer was lost (a primary that
died or was paused mid-call, a Sentinel failover): an append whose frame id
is already there with the same body answers 1 whatever happened since; an
advance carries a nonce and answers 1 if the epoch it made is the current one;
apply and cancel are idempotent by the table. `token_log_buffered` relies on
this when it replays what it held while Redis was away.
"""

from __future__ import annotations

import json
import secrets
from datetime import timedelta
from typing import Any

import redis.asyncio as aioredis

from common.redis_url import async_redis_client
from gateway.stream_status import LUA_TRANSITIONS, StreamEvent, StreamStatus
from gateway.token_log import Frame, StreamRecord

# Every script: KEYS[1] meta hash, KEYS[2] frame stream, KEYS[3] owner key. The status rules come
# from `stream_status` (LUA_TRANSITIONS defines T and TERMINAL), never written here by hand.
_APPEND = LUA_TRANSITIONS + """
local held = redis.call('XRANGE', KEYS[2], ARGV[2], ARGV[2])
if #held > 0 then
  if held[1][2][2] == ARGV[3] then return 1 end
  return 0
end
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return 0 end
if TERMINAL[redis.call('HGET', KEYS[1], 'status')] then return 0 end
if ARGV[5] ~= '' and #redis.call('XRANGE', KEYS[2], ARGV[5], ARGV[5]) == 0 then return 0 end
redis.call('XADD', KEYS[2], ARGV[2], 'f', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 1
"""
_ADVANCE = LUA_TRANSITIONS + """
if ARGV[5] ~= '' and redis.call('HGET', KEYS[1], 'advanced_by') == ARGV[5]
   and tonumber(redis.call('HGET', KEYS[1], 'epoch')) == tonumber(ARGV[1]) + 1 then return 1 end
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return 0 end
local row = T[redis.call('HGET', KEYS[1], 'status')]
if not row or not row['advance'] then return 0 end
redis.call('HSET', KEYS[1], 'epoch', tonumber(ARGV[1]) + 1, 'status', row['advance'], 'advanced_by', ARGV[5])
if ARGV[4] == '1' then redis.call('HINCRBY', KEYS[1], 'migrations', 1) end
redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3])
return 1
"""
_APPLY = LUA_TRANSITIONS + """
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return 0 end
local row = T[redis.call('HGET', KEYS[1], 'status')]
if not row or not row[ARGV[2]] then return 0 end
redis.call('HSET', KEYS[1], 'status', row[ARGV[2]])
return 1
"""
_CANCEL = LUA_TRANSITIONS + """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 0 end
local row = T[status]
if not row or not row['cancel'] then return 0 end
if TERMINAL[status] then return 1 end
redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSET', KEYS[1], 'status', row['cancel'])
return 1
"""
_REFRESH_OWNER = """
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3])
return 1
"""
_RELEASE_OWNER = """
if redis.call('GET', KEYS[3]) == ARGV[1] then redis.call('DEL', KEYS[3]) end
return 1
"""


class RedisTokenLog:
    def __init__(self, client: aioredis.Redis, *, prefix: str = "lifeline:stream",
                 retention: timedelta = timedelta(minutes=10), owner_ttl: timedelta = timedelta(seconds=2)) -> None:
        self.redis = client
        self.prefix = prefix
        self.retention_ms = int(retention.total_seconds() * 1000)
        self.owner_ttl_ms = int(owner_ttl.total_seconds() * 1000)
        self._append = client.register_script(_APPEND)
        self._advance = client.register_script(_ADVANCE)
        self._apply = client.register_script(_APPLY)
        self._cancel = client.register_script(_CANCEL)
        self._refresh = client.register_script(_REFRESH_OWNER)
        self._release = client.register_script(_RELEASE_OWNER)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> RedisTokenLog:
        return cls(async_redis_client(url), **kwargs)

    def _keys(self, request_id: str) -> list[str]:
        base = f"{self.prefix}:{{{request_id}}}"
        return [f"{base}:meta", f"{base}:frames", f"{base}:owner"]

    async def create(self, request_id: str, request: dict[str, Any], *, owner: str) -> None:
        meta, _, owner_key = self._keys(request_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(meta, mapping={"request": json.dumps(request), "epoch": 0, "status": StreamStatus.ACTIVE.value, "migrations": 0})
            pipe.pexpire(meta, self.retention_ms)
            pipe.set(owner_key, owner, px=self.owner_ttl_ms)
            await pipe.execute()

    async def restore(self, record: StreamRecord, frames: list[Frame], *, owner: str) -> None:
        """Write a stream's whole state as the replica driving it knows it (meta, every frame, ownership).

        For a stream the log lost part of in a failover (asynchronous replication drops the last
        writes): `token_log_buffered` calls it only when the log is *behind* that replica.
        """
        meta, stream, owner_key = self._keys(record.request_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(stream)
            pipe.hset(meta, mapping={"request": json.dumps(record.request), "epoch": record.epoch,
                                     "status": record.status.value, "migrations": record.migrations})
            pipe.pexpire(meta, self.retention_ms)
            for frame in frames:
                pipe.xadd(stream, {"f": frame.to_json()}, id=f"{frame.seq + 1}-0")
            if frames:
                pipe.pexpire(stream, self.retention_ms)
            pipe.set(owner_key, owner, px=self.owner_ttl_ms)
            await pipe.execute()

    async def get(self, request_id: str) -> StreamRecord | None:
        raw = await self.redis.hgetall(self._keys(request_id)[0])
        if not raw:
            return None
        return StreamRecord(request_id, json.loads(raw["request"]), int(raw["epoch"]), StreamStatus(raw["status"]),
                            int(raw.get("migrations", 0)))  # absent in records written before the count was kept

    async def append(self, request_id: str, epoch: int, frame: Frame) -> bool:
        # ARGV[5]: the previous frame, which must be there: a log that lost frames in a failover refuses
        # rather than take a frame after a hole (token_log_buffered then writes the stream back).
        previous = f"{frame.seq}-0" if frame.seq > 0 else ""
        ok = await self._append(keys=self._keys(request_id),
                                args=[epoch, f"{frame.seq + 1}-0", frame.to_json(), self.retention_ms, previous])
        return bool(ok)

    async def frames_after(self, request_id: str, after_seq: int) -> list[Frame]:
        entries = await self.redis.xrange(self._keys(request_id)[1], min=f"{after_seq + 2}-0", max="+")
        return [Frame.from_json(fields["f"]) for _, fields in entries]

    async def wait_frames(self, request_id: str, after_seq: int, timeout: float) -> list[Frame]:
        frames = await self.frames_after(request_id, after_seq)
        if frames:
            return frames
        stream = self._keys(request_id)[1]
        # Block for less than the socket timeout, or a quiet stream would read as a dead Redis.
        socket_timeout = self.redis.connection_pool.connection_kwargs.get("socket_timeout") or timeout
        block = min(timeout, 0.8 * socket_timeout)
        result = await self.redis.xread({stream: f"{after_seq + 1}-0"}, block=max(1, int(block * 1000)))
        return [Frame.from_json(fields["f"]) for _, entries in result for _, fields in entries]

    async def advance_epoch(self, request_id: str, expected: int, *, owner: str, migration: bool = False,
                            nonce: str | None = None) -> bool:
        """`nonce`: send the same one again after a lost answer and get 1 if that very advance applied."""
        nonce = nonce or secrets.token_hex(8)
        return bool(await self._advance(keys=self._keys(request_id),
                                        args=[expected, owner, self.owner_ttl_ms, int(migration), nonce]))

    async def apply(self, request_id: str, epoch: int, event: StreamEvent) -> bool:
        return bool(await self._apply(keys=self._keys(request_id), args=[epoch, event.value]))

    async def cancel(self, request_id: str) -> bool:
        return bool(await self._cancel(keys=self._keys(request_id), args=[]))

    async def refresh_owner(self, request_id: str, owner: str, epoch: int) -> bool:
        return bool(await self._refresh(keys=self._keys(request_id), args=[epoch, owner, self.owner_ttl_ms]))

    async def release_owner(self, request_id: str, owner: str) -> None:
        await self._release(keys=self._keys(request_id), args=[owner])

    async def owner(self, request_id: str) -> str | None:
        return await self.redis.get(self._keys(request_id)[2])

    async def close(self) -> None:
        await self.redis.aclose()
