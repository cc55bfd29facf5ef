"""Injected faults, shared by every request of the process: the `EngineHooks` for drills and tests.

The scheduler and the serving layer reach faults only through the hook
methods (`engine.hooks`); nothing here writes another component's fields.
Every fault that fires logs one `fault injected` line and counts in
`lifeline_engine_faults_injected_total{fault=...}`, so a test or an operator
can tell an injected failure from a real one.
"""

from __future__ import annotations

import asyncio
import os
import threading

import torch

from common.logs import get_logger
from engine.errors import InjectedFailure
from engine.metrics import EngineMetrics
from engine.model import LlamaModel
from engine.settings import FaultSettings

log = get_logger(__name__)


class FaultInjector:
    def __init__(self, settings: FaultSettings, metrics: EngineMetrics, model: LlamaModel) -> None:
        self.settings = FaultSettings()
        self.metrics = metrics
        self.model = model
        self.tokens_sent = 0
        self._hang_forever = asyncio.Event()  # never set
        self._faults_changed = threading.Condition()  # wakes a stalled decode step when faults change
        self.apply(settings)

    def apply(self, settings: FaultSettings) -> None:
        """Install a new fault set (from flags at start, or the admin endpoint)."""
        if settings.corrupt_weights and not self.settings.corrupt_weights:
            self._corrupt(self.model)
        elif self.settings.corrupt_weights:
            settings = settings.model_copy(update={"corrupt_weights": True})  # cannot be undone in place
        with self._faults_changed:
            self.settings = settings
            self._faults_changed.notify_all()
        if settings.token_delay_ms:
            self._fired("token_delay", delay_ms=settings.token_delay_ms)
        if settings.first_token_delay_ms:
            self._fired("first_token_delay", delay_ms=settings.first_token_delay_ms)
        log.info("faults configured", **settings.model_dump())

    def snapshot(self) -> dict:
        return {**self.settings.model_dump(), "tokens_sent": self.tokens_sent}

    def _fired(self, fault: str, **fields: object) -> None:
        self.metrics.faults.labels(fault=fault).inc()
        log.warning("fault injected", fault=fault, **fields)

    def _corrupt(self, model: LlamaModel) -> None:
        # Shift the output head by one row: health checks still pass, every token changes.
        model.w["lm_head.weight"] = torch.roll(model.w["lm_head.weight"], shifts=1, dims=0)
        self._fired("corrupt_weights")

    # -- EngineHooks ---------------------------------------------------------
    def first_token_delay_s(self) -> float:
        return self.settings.first_token_delay_ms / 1000.0

    def token_delay_s(self) -> float:
        return self.settings.token_delay_ms / 1000.0

    def _step_stalled(self) -> bool:
        stall_after = self.settings.stall_step_after_tokens
        return stall_after is not None and self.tokens_sent >= stall_after

    def before_step(self) -> None:
        """On the decode thread: block inside the step until the admin endpoint clears the fault.

        Unlike `hang_after_tokens` (one stream stops sending, the loop keeps
        stepping), this wedges the loop itself, as a stuck kernel would: every
        stream stops and the watchdog sees a step that does not finish.
        """
        if not self._step_stalled():
            return
        self._fired("stall_step", tokens_sent=self.tokens_sent)
        with self._faults_changed:
            while self._step_stalled():
                self._faults_changed.wait(timeout=1.0)
        log.warning("decode step resumed", tokens_sent=self.tokens_sent)

    def admit_request(self) -> None:
        if self.settings.fail_next_requests <= 0:
            return
        remaining = self.settings.fail_next_requests - 1
        self.settings = self.settings.model_copy(update={"fail_next_requests": remaining})
        self._fired("fail_request", remaining=remaining)
        raise InjectedFailure("injected failure")

    async def before_send(self) -> None:
        """Called before each token is sent: may exit the process or hang this stream."""
        exit_after = self.settings.exit_after_tokens
        if exit_after is not None and self.tokens_sent >= exit_after:
            self._fired("exit", tokens_sent=self.tokens_sent)
            # Let the event loop flush what earlier sends left in transport buffers, so
            # "after N tokens" means N tokens reached the socket, then die without cleanup.
            await asyncio.sleep(0.05)
            os._exit(137)
        hang_after = self.settings.hang_after_tokens
        if hang_after is not None and self.tokens_sent >= hang_after:
            self._fired("hang", tokens_sent=self.tokens_sent)
            await self._hang_forever.wait()

    def after_send(self, count: int) -> None:
        self.tokens_sent += count
