"""Request recovery: keep one stream going while the engines under it fail.

A `StreamSession` drives one request: the epoch, the commits and the choice
after a failure. Each engine stream is one `attempt.Attempt`; the session
commits every token it yields (token log first, client second). When the
engine fails — connect refused, connection reset, 5xx, a stall, a lapsed
lease — the strategy decides (`policy.decide`):

    fail_stop             end the stream with a typed error
    retry_from_scratch    resend the original prompt; regenerate (and check,
                          then skip) the tokens the client already has
    token_commit_resume   send `prompt ‖ committed tokens` with max_tokens
                          reduced to another ready engine (default)

Every re-send to an engine is a migration: it advances the request epoch by
compare-and-set in the token log (frames from an older epoch are fenced off
there) and counts against `max_migrations`. Failures include an engine that
ends the stream with a finish the client did not ask for (vLLM's "abort":
`engine_aborted`) and one whose chunks carry no token ids (`no_token_ids`).
A continuation goes to an endpoint `(instance_id, generation)` that has not
failed it; to one that has only when no other is routable, the one that just
failed it last of all (`Router.acquire(avoid=…)`); one that is ejected
(gateway/outlier.py) is not routable. A migration needs
all of: no grammar state once a token is committed, fewer than
`max_migrations` so far, more than `min_deadline_remaining` left before the
original deadline, and a token from the retry budget. The budget bounds
*concurrent* migrations (Envoy's semantics): the token is held from the
failure until the continuation's first token, not for the rest of the
stream; a planned shutdown (the engine ends the stream with
`engine_draining`, or goes silent after it left routing:
`engine_left_routing`) migrates without one. The first migration goes at
once; later ones back off (`recovery.migration_backoff`, full jitter). An
engine that answers 429 (its queue full: `engine_overloaded`) is busy, not
broken: that is admission, and the request waits for room
(`_wait_for_room`): re-sent with the same backoff, not a migration, not a
budget token, not toward the engine's ejection; a request the client has no
byte of gets the client's 429 `overloaded` after `admission.queue_timeout`,
a started stream waits until its deadline. Otherwise the stream ends with
an SSE `error` event whose `type` is one of `engine_failed`,
`not_resumable`, `migration_limit`, `deadline_exceeded`,
`retry_budget_exhausted`, `no_healthy_endpoint`, `engine_incompatible` (the
last failure was an engine without token ids), `overloaded`, `diverged`,
`cancelled`, after a last chunk with `finish_reason: "error"`.

Semantic promise: greedy and seeded requests continue token-identically on
engines with position-keyed sampling (the reference engine); the gateway
gives unseeded sampled requests a seed so they are seeded too.

The stream's status moves only as `stream_status.TRANSITIONS` allows.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from tokenizers import Tokenizer

from common.detokenize import TextAssembler
from common.logs import get_logger
from contract.openai import usage
from contract.session import SESSION_USAGE_KEY
from gateway.attempt import Attempt
from gateway.deps import Deps, hold_ownership
from contract.engine_support import INCOMPATIBLE_ERROR_TYPE
from contract.sampling import Sampling
from gateway.engine_client import DRAINING, LEFT_ROUTING, NO_TOKEN_IDS, OVERLOADED, EngineFailure, EngineRejected, EngineToken, Opened
from gateway.errors import EnginePassthrough, GatewayError, NoHealthyEndpoint, Overloaded, RecoveryImpossible, StreamCancelled
from gateway.policy import continuation_refused, decide
from gateway.outlier import EndpointKey
from gateway.router import Endpoint, NoExactContinuation
from gateway.sessions import SessionTurn
from gateway.settings import RecoveryStrategy
from gateway.stream_request import StreamRequest
from gateway.stream_status import StreamEvent, StreamStatus
from gateway.token_log import Frame

log = get_logger(__name__)


class Fenced(Exception):
    """Our request epoch is no longer current: cancelled, or another replica took over."""


MAY_DIFFER = "may_differ"  # `lifeline.continuation` of every chunk after an inexact move
OPENED = object()  # yielded once the first engine accepted the request: HTTP 200 may go out


def cancelled_frames(seq: int, epoch: int) -> list[Frame]:
    """What an attached client gets when the stream is cancelled (DELETE): a last chunk and a typed error."""
    error = StreamCancelled("the stream was cancelled (DELETE /v1/streams/{request_id})")
    return [Frame(seq=seq, kind="token", epoch=epoch, finish_reason="error"),
            Frame(seq=seq + 1, kind="error", epoch=epoch, error=error.body()["error"])]


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
    turn: SessionTurn | None = None  # the session turn this stream answers (gateway/sessions.py)
    headers: Mapping[str, str] | None = None  # the client's, for its trace context (gateway/tracing.py)

    def __post_init__(self) -> None:
        self.text = TextAssembler(self.tokenizer, self.request.stop)
        self.log = log.bind(request_id=self.request.request_id, epoch=self.epoch)
        self.span: Any = None  # this stream's trace span while it runs (gateway/tracing.py), if tracing
        self._failed_at: float | None = None
        self._holds_retry_token = False
        self._opened = False
        self._failed_endpoints: list[EndpointKey] = []  # in order; the last is never routed to again, the rest last
        self._last_failure: EngineFailure | None = None
        # An engine's 429 (engine_overloaded) is admission, not failure (`_wait_for_room`): consecutive ones, the
        # time spent waiting them out, and the endpoint that said it was full, all reset by the next token.
        self._overloads = 0
        self._overload_waited = 0.0
        self._full: EndpointKey | None = None
        # A sampled stream's committed tokens can be redrawn token for token only while every one of them came
        # from a position-keyed engine (contract/sampling.py); once a move could not keep that, every later
        # token says `continuation: may_differ`.
        self.redrawable = True
        self.continuation: str | None = None

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
        session.redrawable = all(f.redrawable for f in frames)
        session.continuation = next((f.continuation for f in reversed(frames) if f.continuation), None)
        session._opened = True
        return session

    # -- the drive loop --------------------------------------------------------
    async def run(self) -> AsyncIterator[Frame | object]:
        """Yield OPENED once, then committed frames until done or a terminal error frame."""
        deps, rid = self.deps, self.request.request_id
        self.span = deps.tracing.stream_span(self.request, self.headers)
        heartbeat = asyncio.create_task(hold_ownership(deps, rid, lambda: self.epoch), name=f"owner-heartbeat-{rid}")
        deps.metrics.active.inc()
        deps.router.begin()
        outcome = "detached"
        try:
            async with aclosing(self._drive()) as items:
                async for item in items:
                    yield item
            outcome = "finished"
        except RecoveryImpossible as exc:
            outcome = "failed"
            deps.metrics.recovery_failures.labels(type=exc.error_type).inc()
            self.log.warning("stream cannot continue", type=exc.error_type, reason=exc.message)
            if not self._opened:
                raise
            for frame in await self._error_frames(exc):
                yield frame
        except Fenced:
            outcome = "fenced"
            record = await deps.token_log.get(rid)
            if record is not None and record.status is StreamStatus.CANCELLED:
                outcome = "cancelled"
                self.log.info("stream cancelled")
                if self._opened:
                    for frame in cancelled_frames(self.next_seq, record.epoch):
                        yield frame
            else:
                self.log.info("stream fenced off: another replica took over")
        except GatewayError:
            outcome = "rejected"
            raise
        finally:
            heartbeat.cancel()
            deps.metrics.active.dec()
            deps.router.end()
            self._end_retry()
            if outcome == "detached" and not self.finished:
                # The client went away mid-stream: engine work is cancelled (our caller closed the
                # engine stream), the committed frames stay resumable.
                await deps.token_log.apply(rid, self.epoch, StreamEvent.DETACH)
                await deps.token_log.release_owner(rid, deps.replica_id)
                self.log.info("client detached; engine request cancelled", committed=len(self.committed))
            deps.metrics.requests.labels(outcome=outcome).inc()
            deps.tracing.end(self.span, outcome=outcome, migrations=self.migrations, tokens=len(self.committed))

    async def _drive(self) -> AsyncIterator[Frame | object]:
        if self.committed and (refusal := continuation_refused(self.request)):
            raise RecoveryImpossible("not_resumable", refusal)  # a client resume of a stream that cannot continue
        while not self.finished:
            endpoint = await self._acquire()
            attempt_id = f"{self.request.request_id}.{self.epoch}"
            span = self.deps.tracing.attempt_span(self.span, endpoint, epoch=self.epoch, attempt_id=attempt_id)
            attempt = Attempt(self.deps, endpoint, self.request, self.committed, attempt_id=attempt_id,
                              remaining=self._remaining(), usage_stats=self.turn is not None,
                              traceparent=self.deps.tracing.traceparent(span))
            log_ = self.log.bind(instance=endpoint.instance_id, generation=endpoint.generation)
            failure_reason: str | None = None
            try:
                async with aclosing(attempt.tokens()) as items:
                    async for item in items:
                        if isinstance(item, Opened):
                            if not self._opened:
                                self._opened = True
                                yield OPENED
                                if self.request.kind == "chat" and self.next_seq == 0:
                                    yield await self._commit(Frame(seq=0, kind="role", epoch=self.epoch))
                            continue
                        for frame in await self._commit_token(item, endpoint):  # type: ignore[arg-type]
                            yield frame
                        if self.finished:
                            log_.info("stream finished", tokens=len(self.committed), migrations=self.migrations)
                            self.deps.served.note(endpoint.key, self.deps.clock.utcnow())  # real traffic as a probe
                            return
            except EngineFailure as failure:
                failure_reason = failure.reason
                if failure.reason == OVERLOADED:
                    await self._wait_for_room(failure, endpoint)
                    continue
                log_.warning("engine failed mid-request", reason=failure.reason, detail=str(failure), committed=len(self.committed))
                if endpoint.key in self._failed_endpoints:
                    self._failed_endpoints.remove(endpoint.key)
                self._failed_endpoints.append(endpoint.key)
                self._last_failure = failure
                self.deps.tracing.end(span, failure=failure.reason)  # the attempt is over; the move is the stream's
                span = None
                await self._migrate(failure)
            except EngineRejected as rejected:
                failure_reason = f"rejected {rejected.status_code}"
                if self.committed or self.next_seq:
                    raise RecoveryImpossible("engine_rejected", f"engine refused the continuation: {rejected.body}") from None
                raise EnginePassthrough(rejected.status_code, rejected.body) from None
            except RecoveryImpossible as impossible:
                failure_reason = impossible.error_type
                raise
            finally:
                self.deps.tracing.end(span, failure=failure_reason)

    async def _acquire(self) -> Endpoint:
        prefer = self.request.prefer_instance if self.migrations == 0 and not self.committed else None
        try:
            if not self._exact_continuation_needed():
                return await self._route(prefer=prefer)
            if not self.redrawable:
                self._allow_inexact("an engine with its own sampler drew this stream's tokens; no other engine "
                                    "can redraw them")
                return await self._route(prefer=prefer)
            try:
                return await self._route(prefer=prefer, sampling=Sampling.POSITION_KEYED)
            except NoExactContinuation as exc:
                self._allow_inexact(exc.message)
                return await self._route(prefer=prefer)
        except (NoHealthyEndpoint, Overloaded) as exc:
            if not self._opened:  # the client has no byte yet: the router's own 429/503, Retry-After and all
                self.deps.metrics.rejected.labels(type=exc.error_type).inc()
                raise
            if isinstance(exc, Overloaded):  # every engine's slots taken, this gateway's queue full: busy, not gone
                return await self._wait_for_slot(exc)
            raise self._impossible(exc.error_type, f"no engine to continue on: {exc.message}") from None

    async def _wait_for_slot(self, overloaded: Overloaded) -> Endpoint:
        """A started stream whose continuation found every engine at this gateway's per-engine cap and the queue
        full waits for a slot (the same backoff, until its deadline leaves no room), since nothing
        acknowledged may be lost; new requests are the ones refused with 429."""
        self._overloads += 1
        backoff = self._backoff(self._overloads)
        if backoff > self._room():
            raise self._impossible("overloaded", f"no engine slot to continue on before the deadline: {overloaded.message}")
        self.deps.metrics.overload_resends.inc()
        if backoff > 0:
            await asyncio.sleep(backoff)
        return await self._acquire()

    async def _route(self, *, prefer: str | None, sampling: Sampling | None = None) -> Endpoint:
        """A slot on an engine for the next attempt: the engines that failed this stream only when no other is
        routable — earlier failures first, then the one that last said it was full, the one that just failed last."""
        queue_timeout = self.deps.settings.admission.queue_timeout.total_seconds()
        earlier = tuple(k for k in self._failed_endpoints[:-1] if k != self._full)
        avoid = (*earlier, *((self._full,) if self._full else ()), *self._failed_endpoints[-1:])
        return await self.deps.router.acquire(
            self.request.version, client_key=self.request.client_key,
            queue_timeout=min(queue_timeout, max(self._remaining(), 0.0)), prefer=prefer, avoid=avoid,
            sampling=sampling,
        )

    def _exact_continuation_needed(self) -> bool:
        """A continuation of committed sampled tokens that has not yet been said to differ."""
        # retry_from_scratch regenerates from the prompt under the same seed and checks every token (`diverged`).
        return (bool(self.committed) and self.request.sampled and self.continuation is None
                and self.request.strategy is RecoveryStrategy.TOKEN_COMMIT_RESUME)

    def _allow_inexact(self, why: str) -> None:
        """No engine can redraw this sampled stream: go on only if the request allows it, and say so from now on."""
        if not self.request.inexact_continuation_ok:
            raise RecoveryImpossible("not_resumable", f"{why}; the request carries a seed, so it is not continued "
                                     "differently (send X-Lifeline-Continuation: may-differ to allow it)")
        self.continuation = MAY_DIFFER
        self.deps.metrics.inexact_continuations.inc()
        self.log.warning("sampled stream continues on an engine that cannot redraw it", why=why)

    def _impossible(self, reason: str, message: str) -> RecoveryImpossible:
        """The stream's end; an engine that could not say what it committed is named as the cause, typed."""
        last = self._last_failure
        if last is not None and last.reason == NO_TOKEN_IDS and reason != INCOMPATIBLE_ERROR_TYPE:
            return RecoveryImpossible(INCOMPATIBLE_ERROR_TYPE, f"{last} ({message})")
        return RecoveryImpossible(reason, message)

    def _remaining(self) -> float:
        return self.request.deadline_wall - self.deps.clock.wall()

    async def _migrate(self, failure: EngineFailure) -> None:
        settings = self.deps.settings.recovery
        decision = decide(
            strategy=self.request.strategy, migrations=self.migrations,
            max_migrations=settings.max_migrations, deadline_remaining=self._remaining(),
            min_deadline_remaining=settings.min_deadline_remaining.total_seconds(),
            committed=len(self.committed), stateful=self.request.stateful,
        )
        if not decision.migrate:
            raise self._impossible(decision.reason, f"{decision.message} (last failure: {failure})")
        if failure.reason not in (DRAINING, LEFT_ROUTING) and not self._holds_retry_token:
            # A planned shutdown is no failure of the fleet: it migrates without a budget token. So does a
            # stream on an engine that routing had already taken out (a drain before SIGTERM) and that went silent.
            wait = min(self.deps.settings.admission.queue_timeout.total_seconds(),
                       self._remaining() - settings.min_deadline_remaining.total_seconds())
            if not await self.deps.router.begin_retry(max(wait, 0.0)):
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
        # The first migration goes at once (the engine that died is the likely cause, its peers likely fine);
        # later ones back off, never into the time the deadline keeps.
        backoff = min(self._backoff(self.migrations), self._room())
        self.log.warning("migrating stream", reason=failure.reason, committed=len(self.committed), migration=self.migrations,
                         backoff_s=round(backoff, 3))
        if backoff > 0:
            await asyncio.sleep(backoff)

    async def _wait_for_room(self, failure: EngineFailure, endpoint: Endpoint) -> None:
        """An engine answered 429: its queue is full. That is admission, not a failure, so the request waits for
        room as it would in this gateway's own queue, and is re-sent (to the engine with the most room, the full
        one last) with the same backoff as migrations, counting neither against `max_migrations` nor the retry
        budget, and never toward the engine's ejection (gateway/attempt.py). A request the client has no byte of
        waits at most `admission.queue_timeout` in all, then is the client's 429 `overloaded` with the engine's
        Retry-After; a stream already started waits until its deadline leaves no room, as nothing acknowledged
        may be lost."""
        self._overloads += 1
        self._full = endpoint.key
        self.deps.metrics.overload_resends.inc()
        self._end_retry()  # a migration refused for room is over: waiting for room holds no retry token
        backoff = self._backoff(self._overloads)
        if not self._opened:
            allowed = self.deps.settings.admission.queue_timeout.total_seconds() - self._overload_waited
            if backoff > allowed:
                retry_after = failure.retry_after_s or self.deps.settings.admission.retry_after.total_seconds()
                self.deps.metrics.rejected.labels(type=Overloaded.error_type).inc()
                raise Overloaded(f"the engines for {self.request.version!r} are at their queue limit ({failure})",
                                 retry_after_s=retry_after)
        elif backoff > self._room():
            raise self._impossible("deadline_exceeded", f"the engines stayed full until the deadline ({failure})")
        if not await self.deps.token_log.advance_epoch(self.request.request_id, self.epoch, owner=self.deps.replica_id):
            raise Fenced()
        self.epoch += 1
        self.log = self.log.bind(epoch=self.epoch)
        self.log.info("engine full, request sent again", instance=endpoint.instance_id, overloads=self._overloads,
                      backoff_s=round(backoff, 3), committed=len(self.committed))
        self._overload_waited += backoff
        if backoff > 0:
            await asyncio.sleep(backoff)

    def _backoff(self, attempt: int) -> float:
        """The wait before a stream's `attempt`-th re-send of one kind: none for the first, then a random wait up
        to `migration_backoff` × 2^(attempt-2), at most `migration_backoff_max` (exponential backoff with full
        jitter, so the streams one crash or one full engine turned away do not re-arrive in step)."""
        if attempt < 2:
            return 0.0
        settings = self.deps.settings.recovery
        ceiling = min(settings.migration_backoff_max.total_seconds(),
                      settings.migration_backoff.total_seconds() * 2 ** (attempt - 2))
        return random.uniform(0.0, ceiling)

    def _room(self) -> float:
        """Seconds a wait may take before the deadline keeps no `min_deadline_remaining` to migrate in."""
        return max(0.0, self._remaining() - self.deps.settings.recovery.min_deadline_remaining.total_seconds())

    def _end_retry(self) -> None:
        if self._holds_retry_token:
            self._holds_retry_token = False
            self.deps.router.end_retry()

    async def _commit(self, frame: Frame) -> Frame:
        if not await self.deps.token_log.append(self.request.request_id, self.epoch, frame):
            self.deps.metrics.stale_frames.inc()
            raise Fenced()
        self.next_seq = frame.seq + 1
        return frame

    async def _commit_token(self, token: EngineToken, endpoint: Endpoint) -> list[Frame]:
        self._overloads, self._overload_waited, self._full = 0, 0.0, None  # an engine took it: room was found
        if self._failed_at is not None:
            self.deps.metrics.recovery_gap.observe(self.deps.clock.now() - self._failed_at)
            self._failed_at = None
            self._end_retry()  # the migration is over: its continuation produced a token
        elif not self.committed:
            self.deps.metrics.ttft.observe(self.deps.clock.now() - self.received_at)
            if self.turn is not None and self.migrations == 0:
                self.turn.cached_tokens = token.cached_tokens  # the turn's own prefill, not a migration's
        if (token.finish_reason is not None and token.cached_tokens is not None and self.turn is not None
                and self.turn.cached_tokens is None and self.migrations == 0):
            self.turn.cached_tokens = token.cached_tokens  # vLLM's, read from its usage chunk after the finish
        self.committed.append(token.token_id)
        length_reached = len(self.committed) >= self.request.max_tokens
        finish = token.finish_reason or ("length" if length_reached else None)
        delta, stop_hit = self.text.push(token.token_id, final=finish is not None)
        if stop_hit:
            finish = "stop"
        redrawable = not self.request.sampled or endpoint.sampling == Sampling.POSITION_KEYED.value
        self.redrawable = self.redrawable and redrawable
        frames = [await self._commit(Frame(
            seq=self.next_seq, kind="token", epoch=self.epoch, token_ids=(token.token_id,), text=delta,
            finish_reason=finish, instance=endpoint.instance_id, continuation=self.continuation,
            redrawable=redrawable,
        ))]
        if finish is not None:
            if self.request.include_usage:
                frames.append(await self._commit(Frame(seq=self.next_seq, kind="usage", epoch=self.epoch, usage=self.usage())))
            frames.append(await self._commit(Frame(seq=self.next_seq, kind="done", epoch=self.epoch)))
            await self.deps.token_log.apply(self.request.request_id, self.epoch, StreamEvent.FINISH)
            self.finished = True
            if self.turn is not None and self.deps.sessions is not None:
                self.deps.sessions.finish(self.turn, engine_url=endpoint.url, engine_model=self.request.version,
                                          answer_ids=list(self.committed), answer_text=self.text.text)
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
        await self.deps.token_log.apply(self.request.request_id, self.epoch, StreamEvent.FAIL)
        self.finished = True
        return committed or frames

    def usage(self) -> dict[str, Any]:
        """OpenAI's usage; for a session turn also what the engine restored and the turn's figures (`session`)."""
        if self.turn is None:
            return usage(len(self.request.prompt_ids), len(self.committed))
        return {**usage(len(self.request.prompt_ids), len(self.committed), cached_tokens=self.turn.cached_tokens),
                SESSION_USAGE_KEY: self.turn.figures()}
