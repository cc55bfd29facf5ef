"""Admin calls racing a running cutover: two aborts, an abort against completion, the stop switch mid-cutover.

Each ends in one consistent state with one event per change. The runner
runs in a thread of its own and is held inside a step (a scripted tier
that blocks) so the race happens where the test puts it; on PostgreSQL
and on SQLite.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest

from common.clock import ManualClock
from contract.routing_tier import RoutingTier
from controlplane.db import session_scope
from controlplane.event import service as event_service
from controlplane.event.repository import EventFilter
from controlplane.topology import service as topology
from cutover import flows
from cutover import service as cutover_service
from cutover.drivers.base import AnycastState
from cutover.drivers.step import StepCheck
from cutover.errors import InvalidTransition
from cutover.models import Cutover, CutoverMode
from cutover.scope import Scope, ScopeKind, TargetState
from cutover.runtime import CutoverRuntime
from tests.integration.cutover.test_cutover_support import (  # noqa: F401 - fixtures
    ScriptedDriver,
    policy,
    read_factory,
    runtime,
    scripted,
    topology_two_regions,
)

pytestmark = pytest.mark.usefixtures("topology_two_regions")

EU = Scope(ScopeKind.REGION, "eu", "eu")


def _plan(runtime: CutoverRuntime, tiers: list[RoutingTier]) -> int:  # noqa: F811
    with session_scope(runtime.factory) as session:
        cutover, _ = cutover_service.plan(session, runtime, scope=EU, tiers=tiers, target_state=TargetState.OUT,
                                          reason="eu degraded", mode=CutoverMode.MANUAL, actor="op")
        return cutover.id


def _events(runtime: CutoverRuntime, kind: str) -> list[Any]:  # noqa: F811
    with session_scope(runtime.factory) as session:
        return sorted(event_service.list_events(session, EventFilter(kind=kind), limit=100), key=lambda e: e.id)


def _clusters(runtime: CutoverRuntime) -> dict[str, str]:  # noqa: F811
    with session_scope(runtime.factory) as session:
        return {c.name: c.state for c in topology.list_clusters(session)}


@contextmanager
def running(runtime: CutoverRuntime, cutover_id: int) -> Iterator[dict[str, Cutover]]:  # noqa: F811
    """Execute in a thread; the caller releases the blocking tier, and the runner's result lands in the dict."""
    finished: dict[str, Cutover] = {}
    runner = threading.Thread(target=lambda: finished.update(
        done=flows.execute(runtime, cutover_id=cutover_id, idempotency_key="k", actor="op")))
    runner.start()
    try:
        yield finished
    finally:
        runner.join(60)
    assert not runner.is_alive() and "done" in finished


def test_two_aborts_at_once_write_one_request_and_roll_back_once(
        runtime: CutoverRuntime, scripted: ScriptedDriver, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    cutover_id = _plan(runtime, [RoutingTier.L7, RoutingTier.ANYCAST])  # l7 c-eu-a, l7 c-eu-b, anycast
    # Each abort waits, after reading whether one was already requested, for the other to have read too:
    # if both can read before either writes, both write. The wait gives up after 2 s, once the other is
    # held off (by the cutover's row lock), so the test never hangs on the fix.
    both_read = threading.Barrier(2, timeout=2)
    real_abort_request = flows.abort_request

    def racing_read(session: Any, cutover: Cutover) -> Any:
        found = real_abort_request(session, cutover)
        try:
            both_read.wait()
        except threading.BrokenBarrierError:
            pass
        return found

    monkeypatch.setattr(flows, "abort_request", racing_read)
    scripted.block = threading.Event()
    answers: list[str] = []
    with running(runtime, cutover_id) as finished:
        try:
            assert scripted.blocked.wait(30)  # the runner is inside step 3's write
            aborts = [threading.Thread(target=lambda who=who: answers.append(flows.abort(
                runtime, cutover_id=cutover_id, actor=who, reason=f"abort by {who}").state))
                for who in ("token:op#2", "token:op#3")]
            for thread in aborts:
                thread.start()
            for thread in aborts:
                thread.join(60)
        finally:
            scripted.block.set()
    assert answers == ["executing", "executing"]  # both answered 202 with the cutover as it was
    done = finished["done"]
    assert done.state == "rolled_back" and done.failure is not None and done.failure.startswith("aborted by token:op#")
    assert [s.status for s in done.steps] == ["reverted", "reverted", "reverted"]
    (request,) = _events(runtime, "cutover.abort_requested")
    assert done.failure == f"aborted by {request.actor}: {request.reason}"  # the one request is what the runner read
    assert [e.after["state"] for e in _events(runtime, "cutover.transition")] == [
        "executing", "rolling_back", "rolled_back"]
    assert len(_events(runtime, "cutover.rollback_step")) == 3


class FinalReadHeld(ScriptedDriver):
    """A scripted tier whose second verify of a target (the final re-read, after every step) blocks until released."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.verified: dict[str, int] = {}
        self.release = threading.Event()
        self.in_final_read = threading.Event()

    def verify(self, expected: AnycastState, timeout: timedelta) -> StepCheck:  # type: ignore[override]
        prefix = expected.target.prefix
        self.verified[prefix] = self.verified.get(prefix, 0) + 1
        if self.verified[prefix] == 2:
            self.in_final_read.set()
            self.release.wait(60)
        return super().verify(expected, timeout)


def test_an_abort_that_lands_while_the_runner_verifies_rolls_back_rather_than_completing(
        runtime: CutoverRuntime) -> None:  # noqa: F811
    held = FinalReadHeld(targets={"region:eu": ["203.0.113.0/24"]})
    runtime.drivers = [*[d for d in runtime.drivers if d.tier != RoutingTier.ANYCAST], held]
    cutover_id = _plan(runtime, [RoutingTier.L7, RoutingTier.ANYCAST])
    with running(runtime, cutover_id) as finished:
        try:
            assert held.in_final_read.wait(30)  # every step done; the runner re-reads them before completing
            answer = flows.abort(runtime, cutover_id=cutover_id, actor="token:op#2", reason="wrong region")
            assert answer.state == "verifying"  # 202: a live runner will act on it
        finally:
            held.release.set()
    done = finished["done"]
    assert (done.state, done.failure) == ("rolled_back", "aborted by token:op#2: wrong region")
    assert _clusters(runtime) == {"c-eu-a": "active", "c-eu-b": "active", "c-us-a": "active"}
    assert held.announced["203.0.113.0/24"] is True
    assert len(_events(runtime, "cutover.abort_requested")) == 1
    assert "completed" not in [e.after["state"] for e in _events(runtime, "cutover.transition")]


def test_an_abort_after_completion_is_refused_and_writes_nothing(runtime: CutoverRuntime) -> None:  # noqa: F811
    cutover_id = _plan(runtime, [RoutingTier.L7])
    assert flows.execute(runtime, cutover_id=cutover_id, idempotency_key="k", actor="op").state == "completed"
    with pytest.raises(InvalidTransition, match="roll back a finished one"):
        flows.abort(runtime, cutover_id=cutover_id, actor="token:op#2", reason="too late")
    assert _events(runtime, "cutover.abort_requested") == []
    assert _clusters(runtime)["c-eu-a"] == "draining"


def test_the_stop_switch_flipped_mid_cutover_refuses_its_next_step_and_rolls_back_what_it_did(
        runtime: CutoverRuntime, scripted: ScriptedDriver, clock: ManualClock) -> None:  # noqa: F811
    cutover_id = _plan(runtime, [RoutingTier.ANYCAST, RoutingTier.L7])  # anycast, then l7 c-eu-a, c-eu-b
    scripted.block = threading.Event()
    with running(runtime, cutover_id) as finished:
        try:
            assert scripted.blocked.wait(30)  # inside step 1's write
            with session_scope(runtime.factory) as session:
                cutover_service.set_gate(session, stopped=True, reason="incident freeze", actor="token:op#2",
                                         clock=clock)
        finally:
            scripted.block.set()
    done = finished["done"]
    assert (done.state, done.failure) == ("rolled_back", "step 2: refused by gating.stop_switch")
    assert [s.status for s in done.steps] == ["reverted", "pending", "pending"]
    assert scripted.announced["203.0.113.0/24"] is True
    assert _clusters(runtime) == {"c-eu-a": "active", "c-eu-b": "active", "c-us-a": "active"}  # l7 never touched
    (gate,) = _events(runtime, "cutover.gate")
    assert gate.after == {"stopped": True, "revision": 1}
    (blocked,) = _events(runtime, "cutover.blocked")
    assert (blocked.routing_tier, blocked.after["step"]) == ("l7", 2)
    assert [v["rule"] for v in blocked.after["violations"]] == ["gating.stop_switch"]
    assert len(_events(runtime, "cutover.rollback_step")) == 1
