"""Liveness means "can generate": the step watchdog, and the scheduler that feeds it, on virtual time."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from common.clock import ManualClock
from engine.hooks import NoFaults
from engine.metrics import EngineMetrics
from engine.sampling import SamplingParams
from engine.scheduler import ErrorEvent, Scheduler, Sequence
from engine.watchdog import StepWatchdog

BOUND = 5.0


def test_idle_engine_is_live_however_long_it_idles() -> None:
    clock = ManualClock()
    watchdog = StepWatchdog(clock, bound_s=BOUND)
    clock.advance(10 * BOUND)
    assert watchdog.check().live
    watchdog.step_started()
    watchdog.step_finished()
    clock.advance(10 * BOUND)
    assert watchdog.check().live


@pytest.mark.parametrize(("elapsed", "live"), [(0.0, True), (BOUND, True), (BOUND + 0.001, False), (60.0, False)])
def test_a_step_is_stalled_only_past_the_bound(elapsed: float, live: bool) -> None:
    clock = ManualClock()
    watchdog = StepWatchdog(clock, bound_s=BOUND)
    watchdog.step_started()
    clock.advance(elapsed)
    liveness = watchdog.check()
    assert liveness.live is live and liveness.step_age_s == pytest.approx(elapsed)


def test_finishing_the_step_makes_it_live_again() -> None:
    clock = ManualClock()
    watchdog = StepWatchdog(clock, bound_s=BOUND)
    watchdog.step_started()
    clock.advance(BOUND * 3)
    assert not watchdog.check().live
    watchdog.step_finished()
    assert watchdog.check().live
    watchdog.step_started()  # the next step's age counts from its own start
    clock.advance(BOUND / 2)
    assert watchdog.check().live


def test_an_exited_loop_is_never_live() -> None:
    watchdog = StepWatchdog(ManualClock(), bound_s=BOUND)
    watchdog.loop_exited()
    assert not watchdog.check().live


class StallingHooks(NoFaults):
    """Blocks the first step on the decode thread until released, as `--fault-stall-step-after-tokens` does."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def before_step(self) -> None:
        self.entered.set()
        self.release.wait()


class RefusingModel:
    """Any model work fails: the step ends at once (with an error event) once it is let through."""

    def new_cache(self, _length: int) -> None:
        raise RuntimeError("no model in this test")


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    # Threads make real progress; the deadline only bounds a broken test, it asserts nothing about speed.
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.005)


async def test_scheduler_step_stuck_on_the_decode_thread_turns_liveness_off_until_it_finishes() -> None:
    clock, hooks = ManualClock(), StallingHooks()
    scheduler = Scheduler(RefusingModel(), EngineMetrics(), max_num_seqs=4, hooks=hooks, clock=clock,  # type: ignore[arg-type]
                          step_stall_bound_s=BOUND)
    scheduler.start()
    try:
        clock.advance(100)
        assert scheduler.watchdog.check().live  # idle: no work, no step
        seq = Sequence(request_id="r1", prompt_ids=[1, 2, 3], max_tokens=4, sampling=SamplingParams(temperature=0.0),
                       seed=0, stop_token_ids=frozenset(), logprobs=None, loop=asyncio.get_running_loop())
        scheduler.submit(seq)
        assert await asyncio.to_thread(hooks.entered.wait, 30)
        clock.advance(BOUND)
        assert scheduler.watchdog.check().live
        clock.advance(0.5)
        stalled = scheduler.watchdog.check()
        assert not stalled.live and stalled.step_age_s == pytest.approx(BOUND + 0.5)
        hooks.release.set()
        event = await asyncio.wait_for(seq.events.get(), 30)
        assert isinstance(event, ErrorEvent)
        _wait_until(lambda: scheduler.watchdog.check().live, "the finished step makes the engine live")
        clock.advance(10 * BOUND)
        assert scheduler.watchdog.check().live
    finally:
        hooks.release.set()
        scheduler.stop()
