"""One attempt: one engine stream of a session, from routing to the engine's last token or its failure.

The session (`recovery.StreamSession`) decides what to do after a failure;
an attempt only knows its endpoint and its payload:

- the payload is `prompt ‖ committed` with `max_tokens` reduced
  (token_commit_resume), or the original prompt with the tokens to regenerate
  and check first (retry_from_scratch);
- until the first token it watches the endpoint's lease: an engine whose lease
  lapsed (a hung or partitioned engine) is left at once instead of waiting
  out the first-token timeout, which itself grows with the prompt's expected
  prefill time (`first_token_timeout + prompt tokens / prefill_tokens_per_s`);
- after it, a token later than `recovery.draining_silence` makes the engine
  client ask the router whether the endpoint is still routable (its lease,
  the agent's verdict, local ejection: all in memory); one that left routing
  (a drain before SIGTERM) and went silent is left at once
  (`engine_left_routing`) instead of after `stall_timeout`;
- every failure is reported to the router's outlier detection, the first
  token as a success, except a planned shutdown (`engine_draining`) and an
  engine that already left routing; the engine slot is given back when the
  attempt ends;
- it ends with the engine's final token or an `EngineFailure`, never quietly:
  a session never re-sends without counting a migration.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from gateway.deps import Deps
from gateway.engine_client import DRAINING, LEFT_ROUTING, OVERLOADED, EngineFailure, EngineToken, Opened
from gateway.errors import RecoveryImpossible
from gateway.router import Endpoint
from gateway.settings import RecoveryStrategy
from gateway.stream_request import StreamRequest


class Attempt:
    def __init__(self, deps: Deps, endpoint: Endpoint, request: StreamRequest, committed: list[int], *,
                 attempt_id: str, remaining: float, usage_stats: bool = False, traceparent: str | None = None) -> None:
        self.deps = deps
        self.endpoint = endpoint
        self.request = request
        self.committed = committed
        self.attempt_id = attempt_id
        self.traceparent = traceparent  # W3C trace context of this attempt's span (gateway/tracing.py), if tracing
        from_scratch = request.strategy is RecoveryStrategy.RETRY_FROM_SCRATCH
        prefix = [] if from_scratch else list(committed)
        self.skip = len(committed) if from_scratch else 0  # tokens to regenerate, check and drop
        self._recomputed = 0
        self.payload: dict[str, Any] = {
            "model": request.version,
            "prompt": request.prompt_ids + prefix,
            "max_tokens": request.max_tokens - len(prefix),
            "stream": True,
            "return_token_ids": True,
            **self.sampling(),
        }
        if usage_stats:  # a session turn: the first chunk says what the engine restored (vLLM's usage)
            self.payload["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        recovery = deps.settings.recovery
        prefill = len(self.payload["prompt"]) / recovery.prefill_tokens_per_s
        left = max(remaining, 0.01)  # never wait past the request's deadline
        self.first_token_timeout = min(recovery.first_token_timeout.total_seconds() + prefill, left)
        self.stall_timeout = min(recovery.stall_timeout.total_seconds(), left)
        self.draining_silence = recovery.draining_silence.total_seconds()

    def sampling(self) -> dict[str, Any]:
        """The sampling fields this attempt sends to its endpoint (the request's, unset ones left out).

        One place to add what depends on the endpoint (what it samples with) or on the
        committed prefix; the rest of the payload is the prompt and the token budget.
        """
        return {k: v for k, v in self.request.sampling.items() if v is not None}

    async def tokens(self) -> AsyncIterator[Opened | EngineToken]:
        """`Opened`, then each new token; raises `EngineFailure`, `EngineRejected` or `RecoveryImpossible("diverged")`."""
        deps, endpoint = self.deps, self.endpoint
        deps.metrics.engine_attempts.inc()
        traced = {"traceparent": self.traceparent} if self.traceparent else {}
        stream = deps.engines.stream(endpoint, self.payload, first_token_timeout=self.first_token_timeout,
                                     stall_timeout=self.stall_timeout, attempt_id=self.attempt_id,
                                     watch=lambda: deps.router.left_routing(endpoint), watch_after=self.draining_silence,
                                     **traced)
        try:
            async with aclosing(stream) as items:
                while True:
                    first = await self._watched_next(items)
                    if first is None:
                        raise EngineFailure("stream_ended", "the engine stream ended before its first token")
                    if isinstance(first, EngineToken):
                        break
                    yield first  # Opened: the client's HTTP 200 need not wait for the first token
                deps.router.succeeded(endpoint)
                if self._new(first):
                    yield first
                if first.finish_reason is not None:
                    return
                async for item in items:  # the hot path: one plain iteration per token
                    if self._new(item):  # type: ignore[arg-type]
                        yield item
                    if item.finish_reason is not None:  # type: ignore[union-attr]
                        return
                # The engine client ends only on a final token or a failure; a stream that ends otherwise must
                # not send the session round again without a migration being counted.
                raise EngineFailure("stream_ended", "the engine stream ended without a final token")
        except EngineFailure as failure:
            # A planned stop and a full queue are no fault of the engine's: neither counts toward its ejection.
            if failure.reason not in (DRAINING, LEFT_ROUTING, OVERLOADED) and await deps.router.failed(endpoint, failure.reason):
                deps.metrics.suppressed.inc()
            if failure.reason == "stale_generation":
                deps.metrics.stale_frames.inc()
            raise
        finally:
            await deps.router.release(endpoint)

    def _new(self, token: EngineToken) -> bool:
        """False for a regenerated token the client already has (retry_from_scratch), after checking it."""
        if self._recomputed >= self.skip:
            return True
        if token.token_id != self.committed[self._recomputed]:
            raise RecoveryImpossible("diverged", "the regenerated output differs from what the client already has")
        if token.finish_reason is not None:  # the client's stream went on past this point
            raise RecoveryImpossible("diverged", "the regenerated output ends within what the client already has")
        self._recomputed += 1
        self.deps.metrics.recomputed_tokens.inc()
        return False

    async def _watched_next(self, items: AsyncIterator[Opened | EngineToken]) -> Opened | EngineToken | None:
        """The next item, leaving the engine as soon as its lease lapses (a hung engine says nothing)."""
        poll = self.deps.settings.registry.refresh_interval.total_seconds()
        step = asyncio.ensure_future(anext(items, None))
        try:
            while not step.done():
                await asyncio.wait((step,), timeout=poll)
                if not step.done() and not await self.deps.router.is_live(self.endpoint):
                    raise EngineFailure("lease_lapsed", f"{self.endpoint.instance_id} generation "
                                        f"{self.endpoint.generation} lost its lease before the first token")
        finally:
            if not step.done():
                step.cancel()
                with contextlib.suppress(BaseException):
                    await step
        return step.result()
