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

Two implementations behind `TokenLog`: `MemoryTokenLog` here (embedded
default) and `token_log_redis.RedisTokenLog` (Redis streams). Both follow the
status table in `stream_status`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

from common.clock import Clock, SystemClock
from gateway.stream_status import InvalidTransition, StreamEvent, StreamStatus, advances_epoch, transition


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
    usage: dict[str, Any] | None = None
    instance: str | None = None
    # "may_differ": this token follows a move to an engine that could not redraw the sampled stream exactly.
    continuation: str | None = None
    # False: an engine's own sampler drew this token (contract/sampling.py); no other engine can redraw it.
    redrawable: bool = True

    def to_json(self) -> str:
        body: dict[str, Any] = {"seq": self.seq, "kind": self.kind, "epoch": self.epoch}
        if self.token_ids:
            body["token_ids"] = list(self.token_ids)
        for name in ("text", "finish_reason", "error", "usage", "instance", "continuation"):
            value = getattr(self, name)
            if value:
                body[name] = value
        if not self.redrawable:
            body["redrawable"] = False
        return json.dumps(body, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str) -> Frame:
        d = json.loads(raw)
        return cls(
            seq=d["seq"], kind=d["kind"], epoch=d["epoch"], token_ids=tuple(d.get("token_ids", ())),
            text=d.get("text", ""), finish_reason=d.get("finish_reason"), error=d.get("error"),
            usage=d.get("usage"), instance=d.get("instance"), continuation=d.get("continuation"),
            redrawable=d.get("redrawable", True) is not False,
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

    async def apply(self, request_id: str, epoch: int, event: StreamEvent) -> bool:
        """DETACH, FINISH or FAIL under `epoch`, as `stream_status.TRANSITIONS` allows; False if not."""
        ...

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

    def _step(self, s: _MemoryStream, event: StreamEvent) -> bool:
        try:
            after = transition(s.status, event)
        except InvalidTransition:
            return False
        s.epoch += advances_epoch(s.status, event)
        s.status = after
        self._notify(s)
        return True

    async def advance_epoch(self, request_id: str, expected: int, *, owner: str, migration: bool = False) -> bool:
        s = self._streams.get(request_id)
        if s is None or s.epoch != expected or not self._step(s, StreamEvent.ADVANCE):
            return False
        s.migrations += migration
        s.owner, s.owner_expires_at = owner, self.clock.now() + self.owner_ttl
        return True

    async def apply(self, request_id: str, epoch: int, event: StreamEvent) -> bool:
        s = self._streams.get(request_id)
        return s is not None and s.epoch == epoch and self._step(s, event)

    async def cancel(self, request_id: str) -> bool:
        s = self._streams.get(request_id)
        return s is not None and self._step(s, StreamEvent.CANCEL)

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
