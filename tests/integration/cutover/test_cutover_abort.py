"""An operator aborts a running cutover: the runner stops at its next step boundary and rolls back what it did."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

from common.clock import ManualClock
from contract.routing_tier import RoutingTier
from controlplane.db import session_scope
from controlplane.topology import service as topology
from cutover import flows
from cutover import service as cutover_service
from cutover.errors import InvalidTransition
from cutover.models import CutoverMode
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


def _plan(runtime: CutoverRuntime) -> int:
    with session_scope(runtime.factory) as session:
        cutover, _ = cutover_service.plan(session, runtime, scope=EU, tiers=[RoutingTier.L7, RoutingTier.ANYCAST],
                                          target_state=TargetState.OUT, reason="eu degraded",
                                          mode=CutoverMode.MANUAL, actor="op")
        return cutover.id


def _clusters(runtime: CutoverRuntime) -> dict[str, str]:
    with session_scope(runtime.factory) as session:
        return {c.name: c.state for c in topology.list_clusters(session)}


def test_abort_stops_a_running_cutover_at_the_next_step_and_rolls_everything_back(
        runtime: CutoverRuntime, scripted: ScriptedDriver) -> None:
    cutover_id = _plan(runtime)  # steps: l7 c-eu-a, l7 c-eu-b, anycast 203.0.113.0/24
    scripted.block = threading.Event()
    finished: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: finished.update(
        done=flows.execute(runtime, cutover_id=cutover_id, idempotency_key="k", actor="op")))
    runner.start()
    try:
        assert scripted.blocked.wait(30)  # the runner is inside step 3's write
        held = flows.abort(runtime, cutover_id=cutover_id, actor="token:op#2", reason="wrong region")
        assert held.state == "executing"  # a live runner: the request waits for its next step boundary
        again = flows.abort(runtime, cutover_id=cutover_id, actor="token:op#2", reason="again")
        assert again.state == "executing"
    finally:
        scripted.block.set()
        runner.join(30)
    done = finished["done"]
    assert done.state == "rolled_back" and done.failure == "aborted by token:op#2: wrong region"
    assert [s.status for s in done.steps] == ["reverted", "reverted", "reverted"]
    assert _clusters(runtime) == {"c-eu-a": "active", "c-eu-b": "active", "c-us-a": "active"}
    assert scripted.announced["203.0.113.0/24"] is True
    from controlplane.event import service as event_service
    from controlplane.event.repository import EventFilter

    with session_scope(runtime.factory) as session:
        requests = event_service.list_events(session, EventFilter(kind="cutover.abort_requested"), limit=10)
        assert [(e.actor, e.reason, e.after["cutover_id"]) for e in requests] == [
            ("token:op#2", "wrong region", cutover_id)]  # the second request is not a second event


def test_abort_of_a_cutover_whose_runner_died_rolls_it_back_at_once(
        runtime: CutoverRuntime, scripted: ScriptedDriver, clock: ManualClock) -> None:
    from tests.integration.cutover.test_cutover_support import SimulatedCrash

    cutover_id = _plan(runtime)
    scripted.crash_on_apply = "203.0.113.0/24"
    with pytest.raises(SimulatedCrash):
        flows.execute(runtime, cutover_id=cutover_id, idempotency_key="k", actor="op")
    clock.advance(timedelta(minutes=5).total_seconds())  # the dead runner's claim lapses
    done = flows.abort(runtime, cutover_id=cutover_id, actor="op", reason="runner gone")
    assert done.state == "rolled_back"
    assert _clusters(runtime) == {"c-eu-a": "active", "c-eu-b": "active", "c-us-a": "active"}


def test_only_running_cutovers_can_be_aborted(runtime: CutoverRuntime) -> None:
    cutover_id = _plan(runtime)
    with pytest.raises(InvalidTransition, match="only an executing or verifying"):
        flows.abort(runtime, cutover_id=cutover_id, actor="op", reason="too early")
    assert flows.execute(runtime, cutover_id=cutover_id, idempotency_key="k", actor="op").state == "completed"
    with pytest.raises(InvalidTransition):
        flows.abort(runtime, cutover_id=cutover_id, actor="op", reason="too late")
