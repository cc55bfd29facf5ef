"""Liveness means "can generate": a watchdog on the decode loop's steps.

vLLM's `/health` (and this engine's `/healthz/live` before) said only that the
HTTP process answers; a decode loop wedged inside a step (a stuck kernel, a
lock, a collective that never returns) kept answering 200 while every stream
stalled, so nothing restarted it. The scheduler brackets each step with
`step_started()` / `step_finished()`; `/healthz/live` asks `check()`.

    idle (no step running)             live, however long it has been idle
    a step running for <= bound        live
    a step running for  > bound        stalled: /healthz/live answers 503 decode_loop_stalled
    the loop thread gone               stalled (nothing will ever step again)

A step that finishes makes the engine live again at once. Waiting work is
picked up by the loop at the start of its next step, so "work but no step
finished within the bound" is exactly a step older than the bound (or a dead
loop thread). Time comes from the injected clock; tests run on virtual time.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from common.clock import Clock


@dataclass(frozen=True)
class Liveness:
    live: bool
    step_age_s: float | None  # how long the running step has taken; None when idle
    bound_s: float
    reason: str = ""


class StepWatchdog:
    def __init__(self, clock: Clock, *, bound_s: float) -> None:
        if bound_s <= 0:
            raise ValueError("the step stall bound must be positive")
        self.clock = clock
        self.bound_s = bound_s
        self._lock = threading.Lock()
        self._step_started_at: float | None = None
        self._loop_alive = True

    def step_started(self) -> None:
        with self._lock:
            self._step_started_at = self.clock.now()

    def step_finished(self) -> None:
        with self._lock:
            self._step_started_at = None

    def loop_exited(self) -> None:
        """The loop thread ended without being asked to: nothing will step again."""
        with self._lock:
            self._loop_alive = False

    def check(self) -> Liveness:
        with self._lock:
            started, alive = self._step_started_at, self._loop_alive
        if not alive:
            return Liveness(False, None, self.bound_s, "the decode loop thread has exited")
        if started is None:
            return Liveness(True, None, self.bound_s)
        age = self.clock.now() - started
        if age > self.bound_s:
            return Liveness(False, age, self.bound_s,
                            f"a decode step has run for {age:.1f} s, over the {self.bound_s:g} s bound")
        return Liveness(True, age, self.bound_s)
