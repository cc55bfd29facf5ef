"""The drill run state machine: every edge of the table, and every other pair refused."""

from __future__ import annotations

import pytest

from controlplane.drill.errors import InvalidTransition
from controlplane.drill.states import (
    TERMINAL_STATES,
    TRANSITIONS,
    DrillRunEvent,
    DrillRunState,
    DrillScope,
    may_start,
    transition,
)

S, E = DrillRunState, DrillRunEvent


@pytest.mark.parametrize(("state", "event", "expected"), [
    (S.SCHEDULED, E.HOLD, S.AWAITING_APPROVAL),
    (S.AWAITING_APPROVAL, E.APPROVE, S.SCHEDULED),
    (S.SCHEDULED, E.START, S.RUNNING),
    (S.RUNNING, E.FAULT_CLEARED, S.MEASURING),
    (S.RUNNING, E.ERROR, S.FAILED),
    (S.MEASURING, E.PASS, S.PASSED),
    (S.MEASURING, E.FAIL, S.FAILED),
    (S.SCHEDULED, E.ABORT, S.ABORTED),
    (S.AWAITING_APPROVAL, E.ABORT, S.ABORTED),
    (S.RUNNING, E.ABORT, S.ABORTED),
    (S.MEASURING, E.ABORT, S.ABORTED),
])
def test_allowed_transitions(state, event, expected):
    assert transition(state, event) == expected


def test_every_pair_outside_the_table_is_refused():
    refused = 0
    for state in S:
        for event in E:
            if (state, event) in TRANSITIONS:
                continue
            with pytest.raises(InvalidTransition) as info:
                transition(state, event)
            assert info.value.status_code == 409
            refused += 1
    assert refused == len(S) * len(E) - len(TRANSITIONS)


@pytest.mark.parametrize("state", sorted(TERMINAL_STATES))
def test_terminal_states_are_final(state):
    for event in E:
        with pytest.raises(InvalidTransition):
            transition(state, event)


def test_an_awaiting_run_cannot_start_before_approval():
    with pytest.raises(InvalidTransition):
        transition(S.AWAITING_APPROVAL, E.START)


@pytest.mark.parametrize(("scope", "approved", "allowed"), [
    (DrillScope.INSTANCE, False, True),
    (DrillScope.ZONE, False, False),
    (DrillScope.ZONE, True, True),
    (DrillScope.REGION, False, False),
    (DrillScope.REGION, True, True),
])
def test_zone_and_region_drills_start_only_once_approved(scope, approved, allowed):
    assert may_start(scope, approved=approved) is allowed


def test_unknown_names_are_an_invalid_transition_not_a_crash():
    with pytest.raises(InvalidTransition):
        transition("exploded", "start")
