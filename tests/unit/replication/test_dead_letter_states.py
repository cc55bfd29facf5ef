"""The dead-letter state table: every (state, action) pair, allowed or refused."""

from __future__ import annotations

import pytest

from controlplane.replication.errors import InvalidDeadLetterTransition
from controlplane.replication.states import DeadLetterAction as A
from controlplane.replication.states import DeadLetterState as S
from controlplane.replication.states import transition


@pytest.mark.parametrize("state, action, after", [
    (S.DEAD, A.RETRY, S.RETRYING),
    (S.RETRYING, A.RETRY, S.RETRYING),  # idempotent
    (S.CLEARED, A.RETRY, S.RETRYING),
    (S.DEAD, A.CLEAR, S.CLEARED),
    (S.RETRYING, A.CLEAR, S.CLEARED),
    (S.CLEARED, A.CLEAR, S.CLEARED),  # idempotent
    (S.RETRYING, A.FAILED, S.DEAD),
    (S.DEAD, A.FAILED, None),
    (S.CLEARED, A.FAILED, None),  # an operator's clear wins over a late failure
])
def test_dead_letter_transitions(state, action, after):
    if after is None:
        with pytest.raises(InvalidDeadLetterTransition) as caught:
            transition(state, action)
        assert caught.value.status_code == 409
    else:
        assert transition(state.value, action) == after
