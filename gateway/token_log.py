"""The committed-token log: every frame a stream produced, in order, resumable.

A frame is committed once the gateway has it: it is appended here before it is
written to the client, so a client (or another gateway replica) can resume
after any sequence number it holds. Each stream also keeps its request
(prompt token ids, sampling parameters, deadline), its request epoch, its
status and how many times it migrated to another engine, so any replica can
continue it from `prompt ‖ committed tokens` under the same migration cap.

Request epochs change only by compare-and-set (`advance_epoch`, `cancel`);
`append` is fenced by the epoch, so frames from an older epoch — a late frame
of an engine we migrated away from, a replica that lost ownership — are
rejected. Terminal states (finished, failed, cancelled) are idempotent.

Two implementations behind `TokenLog`: `MemoryTokenLog` (embedded default) and
`RedisTokenLog` (Redis streams; explicit stream ids `<seq+1>-0`, so "after
seq N" is a plain XRANGE / XREAD from `<N+1>-0`).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import Any, Protocol

import redis.asyncio as aioredis

from common.clock import Clock, SystemClock


class StreamStatus(StrEnum):
    ACTIVE = "active"  # a replica is (or was, until its ownership lapsed) driving it
    DETACHED = "detached"  # the client left; engine work was cancelled; resumable
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (StreamStatus.FINISHED, StreamStatus.FAILED, StreamStatus.CANCELLED)


@dataclass(frozen=True)
class StreamRecord:
    request_id: str
    request: dict[str, Any]
    epoch: int
    status: StreamStatus
    migrations: int = 0  # engine-failure moves so far, across resumes and replicas (the cap's count)


@dataclass(frozen=True)
class Frame:
    """One SSE event. kind: role | token | usage | error | done."""

    seq: int
    kind: str
    epoch: int
    token_ids: tuple[int, ...] = ()
    text: str = ""
    finish_reason: str | None = None
    error: dict[str, Any] | None = None
    usage: dict[str, int] | None = None
    instance: str | None = None

    def to_json(self) -> str:
        body = {"seq": self.seq, "kind": self.kind, "epoch": self.epoch}
        if self.token_ids:
            body["token_ids"] = list(self.token_ids)
        for name in ("text", "finish_reason", "error", "usage", "instance"):
            value = getattr(self, name)
            if value:
                body[name] = value
        return json.dumps(body, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str) -> Frame:
        d = json.loads(raw)
        return cls(
            seq=d["seq"], kind=d["kind"], epoch=d["epoch"], token_ids=tuple(d.get("token_ids", ())),
            text=d.get("text", ""), finish_reason=d.get("finish_reason"), error=d.get("error"),
            usage=d.get("usage"), instance=d.get("instance"),
        )


class TokenLog(Protocol):
    async def create(self, request_id: str, request: dict[str, Any], *, owner: str) -> None: ...

    async def get(self, request_id: str) -> StreamRecord | None: ...

    async def append(self, request_id: str, epoch: int, frame: Frame) -> bool:
        """Commit a frame if `epoch` is still the request's epoch; False means fenced off."""
        ...

    async def frames_after(self, request_id: str, after_seq: int) -> list[Frame]: ...

    async def wait_frames(self, request_id: str, after_seq: int, timeout: float) -> list[Frame]:
        """Frames after `after_seq`, waiting up to `timeout` for at least one."""
        ...

    async def advance_epoch(self, request_id: str, expected: int, *, owner: str, migration: bool = False) -> bool:
        """Compare-and-set epoch → epoch+1 and take ownership; False if someone moved first or it is terminal.

        `migration`: the move is to another engine after a failure (not a resume); the stream's
        migration count grows by one in the same step, so the cap holds across resumes and replicas.
        """
        ...

    async def set_status(self, request_id: str, epoch: int, status: StreamStatus) -> bool: ...

    async def cancel(self, request_id: str) -> bool:
        """Advance the epoch and end the stream; wins over any later migration."""
        ...

    async def refresh_owner(self, request_id: str, owner: str, epoch: int) -> bool: ...

    async def release_owner(self, request_id: str, owner: str) -> None: ...

    async def owner(self, request_id: str) -> str | None: ...

    async def close(self) -> None: ...


@dataclass
class _MemoryStream:
    request: dict[str, Any]
    epoch: int = 0
    status: StreamStatus = StreamStatus.ACTIVE
    migrations: int = 0
    frames: list[Frame] = field(default_factory=list)
    owner: str | None = None
    owner_expires_at: float = 0.0
    touched_at: float = 0.0
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class MemoryTokenLog:
    def __init__(self, *, retention: timedelta = timedelta(minutes=10), owner_ttl: timedelta = timedelta(seconds=2),
                 clock: Clock | None = None) -> None:
        self.retention = retention.total_seconds()
        self.owner_ttl = owner_ttl.total_seconds()
        self.clock = clock or SystemClock()
        self._streams: dict[str, _MemoryStream] = {}

    def _sweep(self) -> None:
        horizon = self.clock.now() - self.retention
        for rid in [r for r, s in self._streams.items() if s.touched_at < horizon]:
            del self._streams[rid]

    def _notify(self, stream: _MemoryStream) -> None:
        stream.touched_at = self.clock.now()
        stream.changed.set()
        stream.changed = asyncio.Event()

    async def create(self, request_id: str, request: dict[str, Any], *, owner: str) -> None:
        self._sweep()
        now = self.clock.now()
        self._streams[request_id] = _MemoryStream(request=request, owner=owner, owner_expires_at=now + self.owner_ttl, touched_at=now)

    async def get(self, request_id: str) -> StreamRecord | None:
        s = self._streams.get(request_id)
        return None if s is None else StreamRecord(request_id, s.request, s.epoch, s.status, s.migrations)

    async def append(self, request_id: str, epoch: int, frame: Frame) -> bool:
        s = self._streams.get(request_id)
        if s is None or s.epoch != epoch or s.status.terminal:
            return False
        s.frames.append(frame)
        self._notify(s)
        return True

    async def frames_after(self, request_id: str, after_seq: int) -> list[Frame]:
        s = self._streams.get(request_id)
        if s is None:
            return []
        return s.frames[after_seq + 1 :]  # seq == index

    async def wait_frames(self, request_id: str, after_seq: int, timeout: float) -> list[Frame]:
        s = self._streams.get(request_id)
        if s is None:
            return []
        if len(s.frames) <= after_seq + 1 and not s.status.terminal:
            try:
                await asyncio.wait_for(s.changed.wait(), timeout)
            except TimeoutError:
                pass
        return s.frames[after_seq + 1 :]

    async def advance_epoch(self, request_id: str, expected: int, *, owner: str, migration: bool = False) -> bool:
        s = self._streams.get(request_id)
        if s is None or s.epoch != expected or s.status.terminal:
            return False
        s.epoch += 1
        s.migrations += migration
        s.status = StreamStatus.ACTIVE
        s.owner, s.owner_expires_at = owner, self.clock.now() + self.owner_ttl
        self._notify(s)
        return True

    async def set_status(self, request_id: str, epoch: int, status: StreamStatus) -> bool:
        s = self._streams.get(request_id)
        if s is None or s.epoch != epoch:
            return False
        if s.status.terminal:
            return s.status == status  # idempotent: the same terminal state again is fine
        s.status = status
        self._notify(s)
        return True

    async def cancel(self, request_id: str) -> bool:
        s = self._streams.get(request_id)
        if s is None:
            return False
        if s.status.terminal:
            return s.status == StreamStatus.CANCELLED
        s.epoch += 1
        s.status = StreamStatus.CANCELLED
        self._notify(s)
        return True

    async def refresh_owner(self, request_id: str, owner: str, epoch: int) -> bool:
        s = self._streams.get(request_id)
        if s is None or s.epoch != epoch:
            return False
        s.owner, s.owner_expires_at = owner, self.clock.now() + self.owner_ttl
        return True

    async def release_owner(self, request_id: str, owner: str) -> None:
        s = self._streams.get(request_id)
        if s is not None and s.owner == owner:
            s.owner = None

    async def owner(self, request_id: str) -> str | None:
        s = self._streams.get(request_id)
        if s is None or s.owner is None or s.owner_expires_at <= self.clock.now():
            return None
        return s.owner

    async def close(self) -> None:
        return None


# Every script: KEYS[1] meta hash, KEYS[2] frame stream, KEYS[3] owner key.
_APPEND = """
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return 0 end
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'finished' or status == 'failed' or status == 'cancelled' then return 0 end
redis.call('XADD', KEYS[2], ARGV[2], 'f', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 1
"""
_ADVANCE = """
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return 0 end
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'finished' or status == 'failed' or status == 'cancelled' then return 0 end
redis.call('HSET', KEYS[1], 'epoch', tonumber(ARGV[1]) + 1, 'status', 'active')
if ARGV[4] == '1' then redis.call('HINCRBY', KEYS[1], 'migrations', 1) end
redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3])
return 1
"""
_SET_STATUS = """
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return 0 end
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'finished' or status == 'failed' or status == 'cancelled' then
  if status == ARGV[2] then return 1 else return 0 end
end
redis.call('HSET', KEYS[1], 'status', ARGV[2])
return 1
"""
_CANCEL = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 0 end
if status == 'finished' or status == 'failed' then return 0 end
if status == 'cancelled' then return 1 end
redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSET', KEYS[1], 'status', 'cancelled')
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
        self._set_status = client.register_script(_SET_STATUS)
        self._cancel = client.register_script(_CANCEL)
        self._refresh = client.register_script(_REFRESH_OWNER)
        self._release = client.register_script(_RELEASE_OWNER)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> RedisTokenLog:
        return cls(aioredis.from_url(url, decode_responses=True), **kwargs)

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

    async def get(self, request_id: str) -> StreamRecord | None:
        raw = await self.redis.hgetall(self._keys(request_id)[0])
        if not raw:
            return None
        return StreamRecord(request_id, json.loads(raw["request"]), int(raw["epoch"]), StreamStatus(raw["status"]),
                            int(raw.get("migrations", 0)))  # absent in records written before the count was kept

    async def append(self, request_id: str, epoch: int, frame: Frame) -> bool:
        ok = await self._append(keys=self._keys(request_id), args=[epoch, f"{frame.seq + 1}-0", frame.to_json(), self.retention_ms])
        return bool(ok)

    async def frames_after(self, request_id: str, after_seq: int) -> list[Frame]:
        entries = await self.redis.xrange(self._keys(request_id)[1], min=f"{after_seq + 2}-0", max="+")
        return [Frame.from_json(fields["f"]) for _, fields in entries]

    async def wait_frames(self, request_id: str, after_seq: int, timeout: float) -> list[Frame]:
        frames = await self.frames_after(request_id, after_seq)
        if frames:
            return frames
        stream = self._keys(request_id)[1]
        result = await self.redis.xread({stream: f"{after_seq + 1}-0"}, block=max(1, int(timeout * 1000)))
        return [Frame.from_json(fields["f"]) for _, entries in result for _, fields in entries]

    async def advance_epoch(self, request_id: str, expected: int, *, owner: str, migration: bool = False) -> bool:
        return bool(await self._advance(keys=self._keys(request_id), args=[expected, owner, self.owner_ttl_ms, int(migration)]))

    async def set_status(self, request_id: str, epoch: int, status: StreamStatus) -> bool:
        return bool(await self._set_status(keys=self._keys(request_id), args=[epoch, status.value]))

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
