"""The cutover state machine as a table: every (state, event) pair, legal or 409."""

from __future__ import annotations

import itertools

import pytest

from cutover.errors import InvalidTransition
from cutover.states import ACTIVE_STATES, TERMINAL_STATES, TRANSITIONS, CutoverEvent, CutoverState, transition

S, E = CutoverState, CutoverEvent

LEGAL = [
    (S.PLANNED, E.START, S.EXECUTING),
    (S.EXECUTING, E.STEPS_DONE, S.VERIFYING),
    (S.EXECUTING, E.STEP_FAILED, S.ROLLING_BACK),
    (S.EXECUTING, E.ROLLBACK, S.ROLLING_BACK),
    (S.VERIFYING, E.VERIFIED, S.COMPLETED),
    (S.VERIFYING, E.VERIFY_FAILED, S.ROLLING_BACK),
    (S.VERIFYING, E.ROLLBACK, S.ROLLING_BACK),
    (S.COMPLETED, E.ROLLBACK, S.ROLLING_BACK),
    (S.ROLLING_BACK, E.ROLLBACK_DONE, S.ROLLED_BACK),
    (S.ROLLING_BACK, E.ROLLBACK_FAILED, S.FAILED),
    (S.FAILED, E.ROLLBACK, S.ROLLING_BACK),
]


@pytest.mark.parametrize(("state", "event", "after"), LEGAL)
def test_legal_transition_leads_where_the_table_says(state: S, event: E, after: S) -> None:
    assert transition(state, event) == after


ILLEGAL = [(s, e) for s, e in itertools.product(S, E) if (s, e) not in {(a, b) for a, b, _ in LEGAL}]


@pytest.mark.parametrize(("state", "event"), ILLEGAL)
def test_every_other_pair_is_an_invalid_transition_with_409(state: S, event: E) -> None:
    with pytest.raises(InvalidTransition) as caught:
        transition(state, event)
    assert caught.value.status_code == 409
    assert caught.value.error_type == "invalid_transition"


def test_the_table_is_exactly_the_legal_list() -> None:
    assert TRANSITIONS == {(s, e): a for s, e, a in LEGAL}


def test_nothing_leaves_rolled_back_or_starts_twice() -> None:
    assert not [k for k in TRANSITIONS if k[0] == S.ROLLED_BACK]
    assert [k for k in TRANSITIONS if k[1] == E.START] == [(S.PLANNED, E.START)]


def test_transition_accepts_the_stored_strings() -> None:
    assert transition("planned", "start") == S.EXECUTING  # type: ignore[arg-type]


def test_active_and_terminal_states_are_disjoint_and_match_the_sql_index() -> None:
    from cutover.models import ACTIVE_SQL

    assert not ACTIVE_STATES & TERMINAL_STATES
    assert ACTIVE_SQL == "state IN (" + ", ".join(f"'{s}'" for s in sorted(ACTIVE_STATES, key=list(S).index)) + ")"
