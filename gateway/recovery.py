"""Request recovery: keep one stream going while the engines under it fail.

A `StreamSession` drives one request. It sends the prompt to an engine and
commits every token it gets (token log first, client second). When the engine
fails — connect refused, connection reset, 5xx, or a stall — the strategy
decides:

    fail_stop             end the stream with a typed error
    retry_from_scratch    resend the original prompt; regenerate (and check,
                          then skip) the tokens the client already has
    token_commit_resume   send `prompt ‖ committed tokens` with max_tokens
                          reduced to another ready engine (default)

Every migration advances the request epoch by compare-and-set in the token
log; frames from an older epoch are fenced off there. A migration needs all
of: the request is resumable (n == 1), fewer than `max_migrations` so far,
more than `min_deadline_remaining` left before the original deadline, and a
token from the retry budget. Otherwise the stream ends with an SSE `error`
event whose `type` is one of `engine_failed`, `not_resumable`,
`migration_limit`, `deadline_exceeded`, `retry_budget_exhausted`,
`no_healthy_endpoint`, `overloaded`, `diverged`, after a last chunk with
`finish_reason: "error"`.

Semantic promise: greedy and seeded requests continue token-identically on
engines with position-keyed sampling (the reference engine); the gateway
gives unseeded sampled requests a seed so they are seeded too.

State of one request (request epoch in brackets, advanced by CAS):

    ACTIVE[e] ──engine fails──► ACTIVE[e+1] (migrated)      ──► FINISHED
       │                        └─ recovery impossible ──────► FAILED
       ├──client leaves──► DETACHED[e] ──resume──► ACTIVE[e+1]
       └──cancel──► CANCELLED[e+1]   (terminal states are idempotent)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import asdict, dataclass, field
from typing import Any

from tokenizers import Tokenizer

from common.clock import Clock
from gateway.engine_client import EngineClient, EngineFailure, EngineRejected, EngineToken, Opened
from gateway.errors import GatewayError, NoHealthyEndpoint, Overloaded, RecoveryImpossible
from gateway.metrics import GatewayMetrics
from gateway.router import Endpoint, Router
from gateway.settings import GatewaySettings, RecoveryStrategy
from gateway.token_log import Frame, StreamStatus, TokenLog
from common.detokenize import TextAssembler
from common.logs import get_logger

log = get_logger(__name__)


@dataclass
class StreamRequest:
    """Everything needed to (re)issue the request to any engine, from any replica."""

    request_id: str
    kind: str  # "chat" | "completion"
    model: str  # the name the client used
    version: str
    prompt_ids: list[int]
    max_tokens: int
    sampling: dict[str, Any]  # temperature, top_p, top_k, seed, stop_token_ids, ignore_eos
    stop: list[str]
    strategy: RecoveryStrategy
    deadline_wall: float
    created: int
    stream: bool = True
    include_usage: bool = False
    return_token_ids: bool = False
    client_key: str | None = None
    prefer_instance: str | None = None
    resumable: bool = True

    def to_dict(self) -> dict[str, Any]:
        body = asdict(self)
        body["strategy"] = self.strategy.value
        return body

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> StreamRequest:
        return cls(**{**body, "strategy": RecoveryStrategy(body["strategy"])})


@dataclass(frozen=True)
class Decision:
    migrate: bool
    reason: str = ""
    message: str = ""


def decide(
    *, strategy: RecoveryStrategy, resumable: bool, migrations: int, max_migrations: int,
    deadline_remaining: float, min_deadline_remaining: float,
) -> Decision:
    """Pure: may this failed stream move to another engine? (Retry budget is checked after.)"""
    if strategy is RecoveryStrategy.FAIL_STOP:
        return Decision(False, "engine_failed", "the engine failed and the recovery strategy is fail_stop")
    if not resumable:
        return Decision(False, "not_resumable", "requests with n > 1 cannot be continued from one committed prefix")
    if migrations >= max_migrations:
        return Decision(False, "migration_limit", f"the stream already migrated {migrations} times (limit {max_migrations})")
    if deadline_remaining < min_deadline_remaining:
        return Decision(False, "deadline_exceeded", f"{max(deadline_remaining, 0):.2f}s left before the deadline is too little to migrate")
    return Decision(True)


class Fenced(Exception):
    """Our request epoch is no longer current: cancelled, or another replica took over."""


@dataclass
class Deps:
    settings: GatewaySettings
    router: Router
    engines: EngineClient
    token_log: TokenLog
    metrics: GatewayMetrics
    clock: Clock
    replica_id: str


OPENED = object()  # yielded once the first engine accepted the request: HTTP 200 may go out


@dataclass
class StreamSession:
    deps: Deps
    request: StreamRequest
    tokenizer: Tokenizer
    epoch: int = 0
    next_seq: int = 0
    committed: list[int] = field(default_factory=list)
    migrations: int = 0
    finished: bool = False
    received_at: float = 0.0

    def __post_init__(self) -> None:
        self.text = TextAssembler(self.tokenizer, self.request.stop)
        self.log = log.bind(request_id=self.request.request_id, epoch=self.epoch)
        self._failed_at: float | None = None
        self._holds_retry_token = False
        self._opened = False

    @classmethod
    def from_log(cls, deps: Deps, request: StreamRequest, tokenizer: Tokenizer, *, epoch: int, frames: list[Frame],
                 migrations: int) -> StreamSession:
        """Rebuild a session from committed frames (a resume on this or another replica).

        `migrations` comes from the token log, so `max_migrations` counts every engine failure of
        the stream, whichever replica or resume it happened under.
        """
        session = cls(deps, request, tokenizer, epoch=epoch, next_seq=len(frames), received_at=deps.clock.now(), migrations=migrations)
        for frame in frames:
            for token_id in frame.token_ids:
                session.committed.append(token_id)
                session.text.push(token_id, final=False)
        session.text.sent = sum(len(f.text) for f in frames)
        session._opened = True
        return session

    # -- the drive loop --------------------------------------------------------
    async def run(self) -> AsyncIterator[Frame | object]:
        """Yield OPENED once, then committed frames until done or a terminal error frame."""
        metrics, rid = self.deps.metrics, self.request.request_id
        heartbeat = asyncio.create_task(self._heartbeat(), name=f"owner-heartbeat-{rid}")
        metrics.active.inc()
        self.deps.router.admission.retry_budget.active_requests += 1
        outcome = "detached"
        try:
            async with aclosing(self._drive()) as items:
                async for item in items:
                    yield item
            outcome = "finished"
        except RecoveryImpossible as exc:
            outcome = "failed"
            metrics.recovery_failures.labels(type=exc.error_type).inc()
            self.log.warning("stream cannot continue", type=exc.error_type, reason=exc.message)
            if not self._opened:
                raise
            for frame in await self._error_frames(exc):
                yield frame
        except Fenced:
            outcome = "fenced"
            self.log.info("stream fenced off: cancelled or taken over")
        except GatewayError:
            outcome = "rejected"
            raise
        finally:
            heartbeat.cancel()
            metrics.active.dec()
            budget = self.deps.router.admission.retry_budget
            budget.active_requests -= 1
            if self._holds_retry_token:
                budget.release()
            if outcome == "detached" and not self.finished:
                # The client went away mid-stream: engine work is cancelled (our caller closed the
                # engine stream), the committed frames stay resumable.
                await self.deps.token_log.set_status(rid, self.epoch, StreamStatus.DETACHED)
                await self.deps.token_log.release_owner(rid, self.deps.replica_id)
                self.log.info("client detached; engine request cancelled", committed=len(self.committed))
            metrics.requests.labels(outcome=outcome).inc()

    async def _drive(self) -> AsyncIterator[Frame | object]:
        settings = self.deps.settings.recovery
        while not self.finished:
            endpoint = await self._acquire()
            payload, skip = self._payload()
            log_ = self.log.bind(instance=endpoint.instance_id, generation=endpoint.generation)
            self.deps.metrics.engine_attempts.inc()
            recomputed = 0
            try:
                stream = self.deps.engines.stream(
                    endpoint, payload,
                    first_token_timeout=min(settings.first_token_timeout.total_seconds(), max(self._remaining(), 0.01)),
                    stall_timeout=min(settings.stall_timeout.total_seconds(), max(self._remaining(), 0.01)),
                    attempt_id=f"{self.request.request_id}.{self.epoch}",
                )
                async with aclosing(stream) as items:
                    async for item in items:
                        if isinstance(item, Opened):
                            if not self._opened:
                                self._opened = True
                                yield OPENED
                                if self.request.kind == "chat" and self.next_seq == 0:
                                    yield await self._commit(Frame(seq=0, kind="role", epoch=self.epoch))
                            continue
                        assert isinstance(item, EngineToken)
                        if recomputed < skip:
                            if item.token_id != self.committed[recomputed]:
                                raise RecoveryImpossible("diverged", "the regenerated output differs from what the client already has")
                            recomputed += 1
                            self.deps.metrics.recomputed_tokens.inc()
                            continue
                        for frame in await self._commit_token(item, endpoint):
                            yield frame
                        if self.finished:
                            log_.info("stream finished", tokens=len(self.committed), migrations=self.migrations)
                            return
            except EngineFailure as failure:
                log_.warning("engine failed mid-request", reason=failure.reason, detail=str(failure), committed=len(self.committed))
                self.deps.router.suppress(endpoint)
                self.deps.metrics.suppressed.inc()
                if failure.reason == "stale_generation":
                    self.deps.metrics.stale_frames.inc()
                await self._migrate(failure)
            except EngineRejected as rejected:
                if self.committed or self.next_seq:
                    raise RecoveryImpossible("engine_rejected", f"engine refused the continuation: {rejected.body}") from None
                raise _Passthrough(rejected.status_code, rejected.body) from None
            finally:
                await self.deps.router.release(endpoint)

    async def _acquire(self) -> Endpoint:
        admission = self.deps.settings.admission
        try:
            if self.request.prefer_instance and self.migrations == 0 and not self.committed:
                preferred = await self._preferred()
                if preferred is not None:
                    return preferred
            return await self.deps.router.acquire(
                self.request.version, client_key=self.request.client_key,
                queue_timeout=min(admission.queue_timeout.total_seconds(), max(self._remaining(), 0.0)),
            )
        except (NoHealthyEndpoint, Overloaded) as exc:
            if self.migrations == 0 and not self._opened:
                self.deps.metrics.rejected.labels(type=exc.error_type).inc()
                raise
            raise RecoveryImpossible(exc.error_type, f"no engine to continue on: {exc.message}") from None

    async def _preferred(self) -> Endpoint | None:
        """`X-Lifeline-Prefer-Instance`: drills and debugging pin the first attempt to one instance."""
        router = self.deps.router
        for endpoint in await router.endpoints(self.request.version):
            if endpoint.instance_id == self.request.prefer_instance and router.admission.has_room(endpoint.instance_id):
                router.admission.take(endpoint.instance_id)
                return endpoint
        return None

    def _remaining(self) -> float:
        return self.request.deadline_wall - self.deps.clock.wall()

    def _payload(self) -> tuple[dict[str, Any], int]:
        """The engine request for this attempt, and how many leading tokens to skip (retry_from_scratch)."""
        req = self.request
        from_scratch = req.strategy is RecoveryStrategy.RETRY_FROM_SCRATCH
        prefix = [] if from_scratch else self.committed
        body: dict[str, Any] = {
            "model": req.version,
            "prompt": req.prompt_ids + prefix,
            "max_tokens": req.max_tokens - len(prefix),
            "stream": True,
            "return_token_ids": True,
            **{k: v for k, v in req.sampling.items() if v is not None},
        }
        return body, len(self.committed) if from_scratch else 0

    async def _migrate(self, failure: EngineFailure) -> None:
        settings = self.deps.settings.recovery
        decision = decide(
            strategy=self.request.strategy, resumable=self.request.resumable, migrations=self.migrations,
            max_migrations=settings.max_migrations, deadline_remaining=self._remaining(),
            min_deadline_remaining=settings.min_deadline_remaining.total_seconds(),
        )
        if not decision.migrate:
            raise RecoveryImpossible(decision.reason, f"{decision.message} (last failure: {failure})")
        if not self._holds_retry_token:
            if not self.deps.router.admission.retry_budget.try_acquire():
                raise RecoveryImpossible("retry_budget_exhausted", "too many streams are migrating; the retry budget is spent")
            self._holds_retry_token = True
        if not await self.deps.token_log.advance_epoch(self.request.request_id, self.epoch, owner=self.deps.replica_id, migration=True):
            raise Fenced()
        self.epoch += 1
        self.migrations += 1
        self.log = self.log.bind(epoch=self.epoch)
        self._failed_at = self.deps.clock.now()
        self.deps.metrics.migrations.labels(reason=failure.reason, strategy=self.request.strategy.value).inc()
        reprefill = len(self.request.prompt_ids) + (0 if self.request.strategy is RecoveryStrategy.RETRY_FROM_SCRATCH else len(self.committed))
        self.deps.metrics.reprefilled_tokens.inc(reprefill)
        self.log.warning("migrating stream", reason=failure.reason, committed=len(self.committed), migration=self.migrations)

    async def _commit(self, frame: Frame) -> Frame:
        if not await self.deps.token_log.append(self.request.request_id, self.epoch, frame):
            self.deps.metrics.stale_frames.inc()
            raise Fenced()
        self.next_seq = frame.seq + 1
        return frame

    async def _commit_token(self, token: EngineToken, endpoint: Endpoint) -> list[Frame]:
        if self._failed_at is not None:
            self.deps.metrics.recovery_gap.observe(self.deps.clock.now() - self._failed_at)
            self._failed_at = None
        elif not self.committed:
            self.deps.metrics.ttft.observe(self.deps.clock.now() - self.received_at)
        self.committed.append(token.token_id)
        length_reached = len(self.committed) >= self.request.max_tokens
        finish = token.finish_reason or ("length" if length_reached else None)
        delta, stop_hit = self.text.push(token.token_id, final=finish is not None)
        if stop_hit:
            finish = "stop"
        frames = [await self._commit(Frame(
            seq=self.next_seq, kind="token", epoch=self.epoch, token_ids=(token.token_id,), text=delta,
            finish_reason=finish, instance=endpoint.instance_id,
        ))]
        if finish is not None:
            if self.request.include_usage:
                frames.append(await self._commit(Frame(seq=self.next_seq, kind="usage", epoch=self.epoch, usage=self.usage())))
            frames.append(await self._commit(Frame(seq=self.next_seq, kind="done", epoch=self.epoch)))
            await self.deps.token_log.set_status(self.request.request_id, self.epoch, StreamStatus.FINISHED)
            self.finished = True
        return frames

    async def _error_frames(self, exc: RecoveryImpossible) -> list[Frame]:
        frames = [
            Frame(seq=self.next_seq, kind="token", epoch=self.epoch, finish_reason="error"),
            Frame(seq=self.next_seq + 1, kind="error", epoch=self.epoch, error=exc.body()["error"]),
        ]
        committed = []
        for frame in frames:
            try:
                committed.append(await self._commit(frame))
            except Fenced:
                break
        await self.deps.token_log.set_status(self.request.request_id, self.epoch, StreamStatus.FAILED)
        self.finished = True
        return committed or frames

    def usage(self) -> dict[str, int]:
        prompt, completion = len(self.request.prompt_ids), len(self.committed)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    async def _heartbeat(self) -> None:
        """Keep this replica's ownership of the stream fresh while it drives it."""
        ttl = self.deps.settings.token_log.owner_ttl.total_seconds()
        while True:
            await asyncio.sleep(ttl / 3)
            try:
                await self.deps.token_log.refresh_owner(self.request.request_id, self.deps.replica_id, self.epoch)
            except Exception as exc:  # Redis blip: the next beat may succeed; losing ownership is fenced anyway
                self.log.warning("owner heartbeat failed", error=str(exc))


class _Passthrough(GatewayError):
    """An engine's 4xx for the first attempt, relayed as is."""

    def __init__(self, status_code: int, body: dict[str, Any]) -> None:
        error = body.get("error", {}) if isinstance(body, dict) else {}
        super().__init__(str(error.get("message", "engine rejected the request")), param=error.get("param"))
        self.status_code = status_code
        self.error_type = str(error.get("type", "invalid_request_error"))

