"""The decode loop: one thread that owns the model and every KV cache.

Each iteration prefills newly admitted sequences (at least one, then more
while a token budget lasts), then runs one batched decode step over every
running sequence that is due. Each iteration is bracketed for the
`engine.watchdog.StepWatchdog`, so `/healthz/live` can tell a loop that is
idle from one wedged inside a step. Keeping model
work on this thread keeps the HTTP event loop free; results go back to each
request's asyncio queue with `call_soon_threadsafe`. A cancelled sequence is
dropped at the start of the next iteration, so a client that disconnects
costs at most one more decode step.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from dataclasses import dataclass, field

import torch

from common.clock import Clock, SystemClock
from engine.hooks import EngineHooks, NoFaults
from engine.kv_transfer import KVCheckpointer
from engine.metrics import EngineMetrics
from engine.model import KVCache, LlamaModel
from engine.prefix_cache import PrefixCache
from engine.sampling import SamplingParams, sample_token
from engine.watchdog import StepWatchdog
from common.logs import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class TokenEvent:
    token_id: int
    logprob: float
    top_logprobs: dict[int, float] | None
    finish_reason: str | None  # None while generating, then "stop" | "length"


@dataclass(frozen=True)
class ErrorEvent:
    """The sequence ends without finishing: rendered as an error body or SSE error event."""

    message: str
    error_type: str = "InternalServerError"
    code: int = 500


@dataclass(eq=False)  # identity: two requests are never 'equal'
class Sequence:
    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    seed: int
    stop_token_ids: frozenset[int]
    logprobs: int | None
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    output_ids: list[int] = field(default_factory=list)
    cache: KVCache | None = None
    kv_chain: list[str] = field(default_factory=list)  # hashes of the KV blocks published or restored
    # Set by the serving layer's checkpoint lookup (engine.kv_transfer.KVCheckpointer.prefetch), in positions:
    kv_cached_before: int = 0  # the prefix cache held these before the lookup
    kv_imported_upto: int = 0  # and these after it: the difference came from the checkpoint store
    kv_checkpointed_blocks: int = 0  # blocks handed to the checkpoint writer so far
    kv_restored: int = 0  # prompt positions restored at prefill (prefix cache + import): usage's cached_tokens
    cancelled: bool = False
    finished: bool = False
    not_before: float = 0.0
    arrived_at: float = 0.0  # clock.now() when submitted

    def cancel(self) -> None:
        self.cancelled = True


class QueueFull(Exception):
    """`max_waiting` sequences already wait for a decode slot: this one was not queued."""


class Scheduler:
    def __init__(self, model: LlamaModel, metrics: EngineMetrics, *, max_num_seqs: int,
                 max_prefill_tokens: int = 2048, hooks: EngineHooks | None = None,
                 clock: Clock | None = None, prefix_cache: PrefixCache | None = None,
                 checkpointer: KVCheckpointer | None = None, step_stall_bound_s: float = 10.0,
                 max_waiting: int | None = None) -> None:
        self.model = model
        self.metrics = metrics
        self.max_num_seqs = max_num_seqs
        self.max_waiting = max_waiting  # None: unbounded (the self-test's and a standby's private scheduler)
        self.max_prefill_tokens = max_prefill_tokens
        self.hooks: EngineHooks = hooks or NoFaults()
        self.clock: Clock = clock or SystemClock()
        self.prefix_cache = prefix_cache
        self.checkpointer = checkpointer
        self.watchdog = StepWatchdog(self.clock, bound_s=step_stall_bound_s)
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []
        self._wake = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="decode-loop", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()
        self._thread.join(timeout=5)

    def submit(self, seq: Sequence) -> None:
        """Queue `seq` for a decode slot; QueueFull (nothing queued) when `max_waiting` already wait."""
        seq.arrived_at = self.clock.now()
        seq.not_before = seq.arrived_at + self.hooks.first_token_delay_s()
        with self._wake:
            if self.max_waiting is not None and len(self._waiting) >= self.max_waiting:
                raise QueueFull(f"{len(self._waiting)} sequences wait for one of {self.max_num_seqs} decode slots")
            self._waiting.append(seq)
            self.metrics.waiting.set(len(self._waiting))
            self._wake.notify()

    def wake(self) -> None:
        with self._wake:
            self._wake.notify()

    # -- the loop ------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        finally:
            if not self._stopped:
                self.watchdog.loop_exited()

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._stopped and not self._has_work():
                    self._wake.wait(timeout=self._idle_timeout())
                if self._stopped:
                    return
                self._drop_cancelled()
                while self._waiting and len(self._running) < self.max_num_seqs:
                    self._running.append(self._waiting.popleft())
                self.metrics.waiting.set(len(self._waiting))
                self.metrics.running.set(len(self._running))
                running = list(self._running)
            self.watchdog.step_started()
            try:
                self.hooks.before_step()
                self._step(running)
            except Exception as exc:  # a bug must fail the requests, not wedge the loop
                log.exception("decode step failed", error=str(exc))
                for seq in running:
                    self._finish(seq, ErrorEvent(f"engine error: {exc}"))
            finally:
                self.watchdog.step_finished()
            with self._wake:
                self._running = [s for s in self._running if not s.finished]
                self.metrics.running.set(len(self._running))

    def _has_work(self) -> bool:
        now = self.clock.now()
        if self._waiting and len(self._running) < self.max_num_seqs:
            return True
        return any(s.cancelled or s.not_before <= now for s in self._running)

    def _idle_timeout(self) -> float | None:
        pending = [s.not_before for s in (*self._running, *self._waiting)]
        if not pending:
            return None
        return max(0.0, min(pending) - self.clock.now()) + 0.0005

    def _drop_cancelled(self) -> None:
        for seq in [*self._running, *self._waiting]:
            if seq.cancelled and not seq.finished:
                seq.finished = True
                seq.cache = None
                if self.checkpointer is not None:
                    self.checkpointer.forget(seq.request_id)
                self.metrics.requests.labels(outcome="aborted").inc()
                log.info("request aborted", request_id=seq.request_id, generated=len(seq.output_ids))
        self._waiting = deque(s for s in self._waiting if not s.finished)
        self._running = [s for s in self._running if not s.finished]

    def _step(self, running: list[Sequence]) -> None:
        now = self.clock.now()
        due = [s for s in running if not s.cancelled and not s.finished and s.not_before <= now]
        fresh = [s for s in due if s.cache is None]
        # Prefill first, up to a token budget per step (vLLM's max_num_batched_tokens idea):
        # streams migrated here after an engine died get their next token sooner, and a
        # burst of long prompts still cannot stall running streams for more than one budget.
        budget = self.max_prefill_tokens
        prefilled = []
        for seq in fresh:
            if prefilled and len(seq.prompt_ids) > budget:
                break
            seq.cache = self.model.new_cache(len(seq.prompt_ids) + seq.max_tokens)
            if self.prefix_cache is not None:
                seq.kv_chain = self.prefix_cache.restore(seq.prompt_ids, seq.cache)
            reused = seq.cache.length
            logits = self.model.prefill(seq.prompt_ids[reused:], seq.cache)
            self._publish(seq)
            self._count_prefill(seq, reused)
            self.metrics.ttft.observe(self.clock.now() - seq.arrived_at)
            self._emit(seq, logits)
            prefilled.append(seq)
            budget -= len(seq.prompt_ids)
        decoding = [s for s in due if s.cache is not None and s not in prefilled and not s.finished]
        if decoding:
            logits = self.model.decode([s.output_ids[-1] for s in decoding], [s.cache for s in decoding])
            for seq, row in zip(decoding, logits, strict=True):
                self._publish(seq)
                self._emit(seq, row)

    def _count_prefill(self, seq: Sequence, restored: int) -> None:
        """Restored positions split into cached and imported (from the checkpoint store), and the rest prefilled."""
        imported = max(0, min(restored, seq.kv_imported_upto) - seq.kv_cached_before)
        seq.kv_restored = restored
        prefilled = len(seq.prompt_ids) - restored
        self.metrics.prompt_tokens.inc(prefilled)
        self.metrics.kv_reused_tokens.inc(restored - imported)
        self.metrics.kv_imported_tokens.inc(imported)
        if restored:
            log.info("prompt prefilled after restored kv", request_id=seq.request_id, prompt_tokens=len(seq.prompt_ids),
                     cached_tokens=restored - imported, imported_tokens=imported, prefilled_tokens=prefilled)

    def _publish(self, seq: Sequence) -> None:
        """Hand every KV block this sequence has filled to the prefix cache (engine.prefix_cache)."""
        cache = self.prefix_cache
        # Checked here first so a decode step builds the token list only when a block has filled.
        if cache is not None and seq.cache is not None and (len(seq.kv_chain) + 1) * cache.block_tokens <= seq.cache.length:
            started = self.clock.now()
            cache.publish([*seq.prompt_ids, *seq.output_ids], seq.cache, seq.kv_chain)
            self.metrics.kv_decode_thread_seconds.labels(work="publish").inc(self.clock.now() - started)

    def _checkpoint(self, seq: Sequence) -> None:
        """Every `every_tokens` committed tokens, queue the new full blocks for the checkpoint store."""
        if self.checkpointer is not None and seq.cache is not None and self.checkpointer.due(len(seq.output_ids)):
            started = self.clock.now()
            seq.kv_checkpointed_blocks = self.checkpointer.offer(
                seq.request_id, seq.cache.length, [*seq.prompt_ids, *seq.output_ids], seq.cache,
                seq.kv_checkpointed_blocks)
            self.metrics.kv_decode_thread_seconds.labels(work="checkpoint").inc(self.clock.now() - started)

    def _emit(self, seq: Sequence, logits: torch.Tensor) -> None:
        position = len(seq.prompt_ids) + len(seq.output_ids)
        token_id = sample_token(logits, seq.sampling, seq.seed, position)
        seq.output_ids.append(token_id)
        self.metrics.generation_tokens.inc()
        logprob, top = 0.0, None
        if seq.logprobs is not None:
            log_probs = torch.log_softmax(logits.to(torch.float64), dim=-1)
            logprob = float(log_probs[token_id])
            if seq.logprobs > 0:
                values, indices = torch.topk(log_probs, seq.logprobs)
                top = {int(i): float(v) for v, i in zip(values, indices, strict=True)}
        finish_reason = None
        if token_id in seq.stop_token_ids:
            finish_reason = "stop"
        elif len(seq.output_ids) >= seq.max_tokens:
            finish_reason = "length"
        seq.not_before = self.clock.now() + self.hooks.token_delay_s()
        event = TokenEvent(token_id, logprob, top, finish_reason)
        if finish_reason is not None:
            self._finish(seq, event)
        else:
            self._checkpoint(seq)
            seq.loop.call_soon_threadsafe(seq.events.put_nowait, event)

    def _finish(self, seq: Sequence, event: TokenEvent | ErrorEvent) -> None:
        seq.finished = True
        seq.cache = None
        if self.checkpointer is not None:
            self.checkpointer.forget(seq.request_id)
        outcome = "error" if isinstance(event, ErrorEvent) else "finished"
        self.metrics.requests.labels(outcome=outcome).inc()
        seq.loop.call_soon_threadsafe(seq.events.put_nowait, event)
