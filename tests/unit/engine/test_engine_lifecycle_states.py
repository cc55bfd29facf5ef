"""The engine's lifecycle table: which events move which status, and which are refused."""

from __future__ import annotations

import pytest

from engine.lifecycle import TRANSITIONS, EngineStatus, InvalidTransition, LifecycleEvent, transition

S, E = EngineStatus, LifecycleEvent


@pytest.mark.parametrize(("status", "event", "expected"), [
    (S.STARTING, E.SELF_TEST_PASSED, S.READY),
    (S.READY, E.LEASE_LAPSED, S.PARTITIONED),
    (S.PARTITIONED, E.LEASE_REGISTERED, S.READY),
    (S.READY, E.LEASE_REGISTERED, S.READY),
    (S.READY, E.SUPERSEDED, S.SUPERSEDED),
    (S.PARTITIONED, E.DRAIN_STARTED, S.DRAINING),
    (S.READY, E.DRAIN_STARTED, S.DRAINING),
])
def test_allowed_transitions(status: EngineStatus, event: LifecycleEvent, expected: EngineStatus) -> None:
    assert transition(status, event) is expected


@pytest.mark.parametrize("event", list(LifecycleEvent))
def test_draining_is_terminal(event: LifecycleEvent) -> None:
    with pytest.raises(InvalidTransition):
        transition(S.DRAINING, event)


def test_a_superseded_engine_never_comes_back_by_registering() -> None:
    with pytest.raises(InvalidTransition):
        transition(S.SUPERSEDED, E.LEASE_REGISTERED)
    assert {new for new in TRANSITIONS.values()} <= set(EngineStatus)
    assert not any(status is S.STARTING for status in TRANSITIONS.values())
