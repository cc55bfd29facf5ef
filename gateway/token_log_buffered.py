"""The Redis token log with a defined behaviour while Redis is away.

Wraps `token_log_redis.RedisTokenLog`. While Redis answers, every call goes
straight through. When a call of a stream this replica drives fails with a
connection error or a timeout (Redis down, paused, failing over):

- **streams in flight continue**: that frame and every later change of the
  stream (frames, epoch moves of a migration, finish or fail) are held in
  this gateway, in order, and the call answers as the log would have, by the
  same transition table (`stream_status`). The frame is then *committed in
  the gateway*: the client gets it, and a resume on this replica is served
  after the log returns. At most `token_log.outage_buffer_frames` frames are
  held across all streams; a stream that needs more ends with the typed
  error `token_log_unavailable` (its error frames always fit).
  `outage_buffer_frames: 0` means a frame reaches the client only once it is
  in Redis: a commit waits (retrying) up to `recovery.stall_timeout`, then the
  stream ends with `token_log_unavailable`.
- **the log comes back**: a flusher replays what was held, stream by stream,
  in order, then refreshes ownership. The scripts are safe to re-send (see
  `token_log_redis`), so the call that failed first, which may have applied,
  is re-sent as is. A stream another replica moved meanwhile is fenced: what
  it held is dropped and counted.
- **new streams** are refused with 503 `token_log_unavailable` (and
  Retry-After), unless `token_log.admit_non_resumable` is set: then they are
  held in this gateway like the others (no other replica can resume them
  until the log is back) and written to Redis when it returns.
- resumes, tails and cancels need the log: 503 `token_log_unavailable`.
- **the log came back behind**: replication is asynchronous, so a failover
  can lose a stream's last writes (its frames, an epoch move, even its
  creation) that the client already has. When the log answers "no" to a
  stream this replica created and drives, and the log's epoch is *behind*
  ours (or the stream is gone), this replica writes the stream back whole
  (`RedisTokenLog.restore`: meta, every frame, ownership) and carries on;
  only a log *ahead* of us (another replica moved the stream) fences it off.
  Without this the bench saw streams end silently after a failover to a
  replica that had not synced.

Metrics: `lifeline_gateway_token_log_available` (0/1),
`…_token_log_buffered_frames`, `…_token_log_flushed_frames_total`,
`…_token_log_degraded_total{action}` (`refused`, `admitted_non_resumable`,
`buffered_stream`, `buffer_full`, `commit_timeout`, `fenced_on_flush`, `restored`). Log
lines: "token log unreachable; holding frames in the gateway", "token log
back; held frames flushed".
"""

from __future__ import annotations

import asyncio
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import redis
from prometheus_client import CollectorRegistry, Counter, Gauge

from common.logs import get_logger
from gateway.errors import GatewayError, RecoveryImpossible
from gateway.stream_status import (
    InvalidTransition,
    StreamEvent,
    StreamStatus,
    advances_epoch,
    transition,
)
from gateway.token_log import Frame, StreamRecord
from gateway.token_log_redis import RedisTokenLog

log = get_logger(__name__)

UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, OSError, TimeoutError)


class TokenLogUnavailable(GatewayError):
    """The committed-token log cannot be reached; the request would not be resumable."""

    status_code = 503
    error_type = "token_log_unavailable"


@dataclass
class _Held:
    """One stream this replica drives: its state as the log would have it, and what Redis has not got yet."""

    request_id: str
    request: dict[str, Any]
    epoch: int
    status: StreamStatus
    migrations: int
    owner: str
    pending: list[tuple[str, tuple, dict]] = field(default_factory=list)
    frames: list[Frame] = field(default_factory=list)  # every frame acknowledged while this replica drives it
    fenced: bool = False
    touched_at: float = 0.0  # loop time of the last call for it; a stream left alone this long is forgotten
    complete: bool = True  # created here: `frames` is the whole history, so the stream can be written back

    def record(self) -> StreamRecord:
        return StreamRecord(self.request_id, self.request, self.epoch, self.status, self.migrations)


class BufferedTokenLog:
    def __init__(self, inner: RedisTokenLog, *, buffer_frames: int, admit_non_resumable: bool,
                 commit_wait: float, registry: CollectorRegistry | None = None, flush_interval: float = 0.1,
                 forget_after: float | None = None) -> None:
        self.inner = inner
        self.redis = inner.redis
        self.buffer_frames = buffer_frames
        self.admit_non_resumable = admit_non_resumable
        self.commit_wait = commit_wait
        self.flush_interval = flush_interval
        self.forget_after = forget_after if forget_after is not None else inner.retention_ms / 1000
        self._held: dict[str, _Held] = {}
        self._seen: OrderedDict[str, StreamRecord] = OrderedDict()  # last records read, for a resume's mirror
        self._buffered = 0
        self.available = True
        self._flusher: asyncio.Task | None = None
        r = registry or CollectorRegistry()
        self.m_available = Gauge("lifeline_gateway_token_log_available", "1 while the token log answers", registry=r)
        self.m_buffered = Gauge("lifeline_gateway_token_log_buffered_frames", "Frames held in the gateway for the token log", registry=r)
        self.m_flushed = Counter("lifeline_gateway_token_log_flushed_frames", "Held frames written to the token log after an outage", registry=r)
        self.m_degraded = Counter("lifeline_gateway_token_log_degraded", "Decisions taken while the token log was away", ["action"], registry=r)
        self.m_available.set(1)

    # -- availability -------------------------------------------------------------------
    def _down(self, exc: BaseException, request_id: str) -> None:
        if self.available:
            log.error("token log unreachable; holding frames in the gateway", request_id=request_id,
                      error=(str(exc) or type(exc).__name__)[:200], buffer_frames=self.buffer_frames)
        self.available = False
        self.m_available.set(0)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_loop(), name="token-log-flusher")

    def _up(self) -> None:
        if not self.available:
            log.warning("token log back; held frames flushed", streams_still_held=sum(bool(h.pending) for h in self._held.values()))
        self.available = True
        self.m_available.set(1)

    # -- the stream's life -----------------------------------------------------------------
    def _sweep(self) -> None:
        """Forget streams nobody called about for a retention (ended by a path that tells the log nothing)."""
        now = asyncio.get_running_loop().time()
        for rid in [r for r, h in self._held.items() if not h.pending and now - h.touched_at > self.forget_after]:
            del self._held[rid]

    async def create(self, request_id: str, request: dict[str, Any], *, owner: str) -> None:
        self._sweep()
        try:
            await self.inner.create(request_id, request, owner=owner)
        except UNREACHABLE as exc:
            self._down(exc, request_id)
            if not self.admit_non_resumable:
                self.m_degraded.labels(action="refused").inc()
                log.warning("new stream refused: token log unreachable", request_id=request_id)
                raise TokenLogUnavailable("the committed-token log is unreachable; new streams are refused "
                                          "until it returns", retry_after_s=1.0) from None
            self.m_degraded.labels(action="admitted_non_resumable").inc()
            log.warning("new stream admitted without resumability: token log unreachable", request_id=request_id)
            held = _Held(request_id, request, 0, StreamStatus.ACTIVE, 0, owner, touched_at=asyncio.get_running_loop().time())
            held.pending.append(("create", (request_id, request), {"owner": owner}))
            self._held[request_id] = held
            return
        self._held[request_id] = _Held(request_id, request, 0, StreamStatus.ACTIVE, 0, owner,
                                       touched_at=asyncio.get_running_loop().time())

    async def get(self, request_id: str) -> StreamRecord | None:
        held = self._held.get(request_id)
        if held is not None and held.pending:
            return held.record()
        try:
            record = await self.inner.get(request_id)
        except UNREACHABLE as exc:
            if held is not None:
                return held.record()
            raise TokenLogUnavailable(f"the committed-token log is unreachable: {exc}", retry_after_s=1.0) from None
        if record is not None:
            self._seen[request_id] = record
            while len(self._seen) > 1024:
                self._seen.popitem(last=False)
        return record

    async def append(self, request_id: str, epoch: int, frame: Frame) -> bool:
        held = self._held.get(request_id)
        if held is None:
            return await self.inner.append(request_id, epoch, frame)
        if held.fenced:
            return False
        held.touched_at = asyncio.get_running_loop().time()
        if not held.pending:
            try:
                ok = await self.inner.append(request_id, epoch, frame)
                if not ok and held.epoch == epoch and await self._restore_if_behind(held):
                    ok = await self.inner.append(request_id, epoch, frame)
                if ok:
                    held.frames.append(frame)
                return ok
            except UNREACHABLE as exc:
                if self.buffer_frames <= 0:
                    return await self._append_strict(request_id, epoch, frame, exc)
                self._down(exc, request_id)
                self.m_degraded.labels(action="buffered_stream").inc()
        if held.epoch != epoch or held.status.terminal:
            return False
        closing = frame.kind == "error" or frame.finish_reason == "error"
        if self._buffered >= self.buffer_frames and not closing:
            self.m_degraded.labels(action="buffer_full").inc()
            log.error("token log unreachable and the gateway's buffer is full; ending the stream", request_id=request_id,
                      buffer_frames=self.buffer_frames)
            raise RecoveryImpossible("token_log_unavailable",
                                     f"the committed-token log is unreachable and {self.buffer_frames} frames are held already")
        held.pending.append(("append", (request_id, epoch, frame), {}))
        held.frames.append(frame)
        self._buffered += 1
        self.m_buffered.set(self._buffered)
        return True

    async def _append_strict(self, request_id: str, epoch: int, frame: Frame, first: BaseException) -> bool:
        """No buffering allowed: the frame goes to the client only once Redis has it."""
        self._down(first, request_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.commit_wait
        while loop.time() < deadline:
            await asyncio.sleep(0.1)
            try:
                ok = await self.inner.append(request_id, epoch, frame)  # safe to re-send: idempotent by frame id
                held = self._held.get(request_id)
                if not ok and held is not None and held.epoch == epoch and await self._restore_if_behind(held):
                    ok = await self.inner.append(request_id, epoch, frame)
            except UNREACHABLE:
                continue
            self._up()
            if ok and held is not None:
                held.frames.append(frame)
            return ok
        self.m_degraded.labels(action="commit_timeout").inc()
        raise RecoveryImpossible("token_log_unavailable",
                                 f"the committed-token log did not take a frame within {self.commit_wait:g}s")

    async def advance_epoch(self, request_id: str, expected: int, *, owner: str, migration: bool = False) -> bool:
        held = self._held.get(request_id)
        nonce = secrets.token_hex(8)
        if held is None or not held.pending:
            try:
                ok = await self.inner.advance_epoch(request_id, expected, owner=owner, migration=migration, nonce=nonce)
                if not ok and held is not None and held.epoch == expected and await self._restore_if_behind(held):
                    ok = await self.inner.advance_epoch(request_id, expected, owner=owner, migration=migration, nonce=nonce)
            except UNREACHABLE as exc:
                if held is None:
                    raise TokenLogUnavailable(f"the committed-token log is unreachable: {exc}", retry_after_s=1.0) from None
                self._down(exc, request_id)
            else:
                if ok:
                    self._mirror_advance(request_id, expected, owner, migration)
                return ok
        if held.fenced or held.epoch != expected or not self._step(held, StreamEvent.ADVANCE):
            return False
        held.migrations += migration
        held.owner = owner
        held.pending.append(("advance_epoch", (request_id, expected), {"owner": owner, "migration": migration, "nonce": nonce}))
        return True

    def _mirror_advance(self, request_id: str, expected: int, owner: str, migration: bool) -> None:
        held = self._held.get(request_id)
        if held is None:
            seen = self._seen.get(request_id)
            if seen is None:
                return
            held = self._held[request_id] = _Held(request_id, seen.request, expected, seen.status, seen.migrations, owner,
                                                   complete=False)
        held.epoch, held.status, held.owner = expected + 1, StreamStatus.ACTIVE, owner
        held.migrations += migration
        held.touched_at = asyncio.get_running_loop().time()

    async def apply(self, request_id: str, epoch: int, event: StreamEvent) -> bool:
        held = self._held.get(request_id)
        if held is None or not held.pending:
            try:
                ok = await self.inner.apply(request_id, epoch, event)
                if not ok and held is not None and held.epoch == epoch and await self._restore_if_behind(held):
                    ok = await self.inner.apply(request_id, epoch, event)
            except UNREACHABLE as exc:
                if held is None:
                    raise TokenLogUnavailable(f"the committed-token log is unreachable: {exc}", retry_after_s=1.0) from None
                self._down(exc, request_id)
            else:
                if ok and held is not None:
                    self._step(held, event)
                    self._forget_if_done(held)
                return ok
        if held.fenced or held.epoch != epoch or not self._step(held, event):
            return False
        held.pending.append(("apply", (request_id, epoch, event), {}))
        return True

    async def _restore_if_behind(self, held: _Held) -> bool:
        """The log said no: if it is behind this replica (a lossy failover), write the stream back whole."""
        if not held.complete:
            return False
        record = await self.inner.get(held.request_id)
        if record is not None and record.epoch >= held.epoch and not (
                record.epoch == held.epoch and record.status is StreamStatus.ACTIVE and held.status is StreamStatus.ACTIVE
                and len(await self.inner.frames_after(held.request_id, -1)) < len(held.frames)):
            return False  # level with us or ahead: a real refusal (another replica moved it, or it ended)
        await self.inner.restore(held.record(), held.frames, owner=held.owner)
        self.m_degraded.labels(action="restored").inc()
        log.error("token log behind the gateway after a failover; stream written back", request_id=held.request_id,
                  epoch=held.epoch, frames=len(held.frames), log_epoch=None if record is None else record.epoch)
        return True

    def _step(self, held: _Held, event: StreamEvent) -> bool:
        try:
            after = transition(held.status, event)
        except InvalidTransition:
            return False
        held.epoch += advances_epoch(held.status, event)
        held.status = after
        return True

    def _forget_if_done(self, held: _Held) -> None:
        if not held.pending and held.status is not StreamStatus.ACTIVE:
            self._held.pop(held.request_id, None)

    async def refresh_owner(self, request_id: str, owner: str, epoch: int) -> bool:
        held = self._held.get(request_id)
        if held is not None and held.pending:
            return not held.fenced and held.epoch == epoch  # the flusher refreshes it once the log is back
        return await self.inner.refresh_owner(request_id, owner, epoch)

    async def release_owner(self, request_id: str, owner: str) -> None:
        held = self._held.get(request_id)
        if held is not None and held.pending:
            held.pending.append(("release_owner", (request_id, owner), {}))
            return
        try:
            await self.inner.release_owner(request_id, owner)
        except UNREACHABLE as exc:  # it lapses within owner_ttl anyway
            log.warning("token log: owner release failed", request_id=request_id, error=str(exc)[:200])
        if held is not None:
            self._forget_if_done(held)

    # -- reads that need the log ------------------------------------------------------------
    async def frames_after(self, request_id: str, after_seq: int) -> list[Frame]:
        try:
            return await self.inner.frames_after(request_id, after_seq)
        except UNREACHABLE as exc:
            raise TokenLogUnavailable(f"the committed-token log is unreachable: {exc}", retry_after_s=1.0) from None

    async def wait_frames(self, request_id: str, after_seq: int, timeout: float) -> list[Frame]:
        try:
            return await self.inner.wait_frames(request_id, after_seq, timeout)
        except UNREACHABLE as exc:
            raise TokenLogUnavailable(f"the committed-token log is unreachable: {exc}", retry_after_s=1.0) from None

    async def cancel(self, request_id: str) -> bool:
        try:
            return await self.inner.cancel(request_id)
        except UNREACHABLE as exc:
            raise TokenLogUnavailable(f"the committed-token log is unreachable: {exc}", retry_after_s=1.0) from None

    async def owner(self, request_id: str) -> str | None:
        try:
            return await self.inner.owner(request_id)
        except UNREACHABLE as exc:
            raise TokenLogUnavailable(f"the committed-token log is unreachable: {exc}", retry_after_s=1.0) from None

    # -- flushing -----------------------------------------------------------------------------
    @property
    def held_frames(self) -> int:
        return self._buffered

    async def flush(self) -> bool:
        """Replay what is held, stream by stream, in order; True once nothing is held."""
        for held in list(self._held.values()):
            while held.pending:
                name, args, kwargs = held.pending[0]
                try:
                    result = await getattr(self.inner, name)(*args, **kwargs)
                except UNREACHABLE:
                    return False
                held.pending.pop(0)
                if name == "append":
                    self._buffered -= 1
                    self.m_flushed.inc()
                if name in ("append", "advance_epoch", "apply") and result is False:
                    try:
                        if await self._restore_if_behind(held):  # the log lost writes: the whole state, once
                            restored = sum(1 for op in held.pending if op[0] == "append")
                            self._buffered -= restored
                            self.m_flushed.inc(restored)
                            held.pending.clear()
                            break
                    except UNREACHABLE:
                        return False
                    # Another replica moved the stream while the log was away: what we held is not its history.
                    dropped = sum(1 for op in held.pending if op[0] == "append")
                    self._buffered -= dropped
                    held.pending.clear()
                    held.fenced = True
                    self.m_degraded.labels(action="fenced_on_flush").inc()
                    log.error("held frames fenced off on flush: the stream moved on elsewhere",
                              request_id=held.request_id, dropped_frames=dropped)
                    break
            if not held.pending and not held.fenced:
                if held.status is StreamStatus.ACTIVE:
                    try:
                        await self.inner.refresh_owner(held.request_id, held.owner, held.epoch)
                    except UNREACHABLE:
                        return False
                self._forget_if_done(held)
            elif held.fenced and not held.pending:
                self._held.pop(held.request_id, None)
        self.m_buffered.set(self._buffered)
        return True

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval)
            try:
                await self.redis.ping()
            except UNREACHABLE:
                continue
            if await self.flush():
                self._up()
                return

    async def close(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
        await self.inner.close()
