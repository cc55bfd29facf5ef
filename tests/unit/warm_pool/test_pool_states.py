"""Every (state, event) pair: the allowed ones land where the diagram says, the rest raise."""

from __future__ import annotations

import itertools

import pytest

from warm_pool.states import InstanceState as S
from warm_pool.states import InvalidTransition, PoolEvent as E, transition

ALLOWED = {
    (S.COLD, E.LOADED): S.WARM,
    (S.WARM, E.PROMOTED): S.SERVING,
    (S.SERVING, E.DEMOTED): S.WARM,
    (S.SERVING, E.DRAIN): S.DRAINING,
    (S.WARM, E.DRAIN): S.DRAINING,
    (S.DRAINING, E.STOPPED): S.GONE,
    (S.COLD, E.LOST): S.GONE,
    (S.WARM, E.LOST): S.GONE,
    (S.SERVING, E.LOST): S.GONE,
    (S.DRAINING, E.LOST): S.GONE,
}


@pytest.mark.parametrize(("state", "event"), list(itertools.product(S, E)))
def test_transition_table(state: S, event: E) -> None:
    if (state, event) in ALLOWED:
        assert transition(state, event) is ALLOWED[(state, event)]
    else:
        with pytest.raises(InvalidTransition):
            transition(state, event)


def test_gone_is_terminal_and_cold_cannot_serve_without_loading() -> None:
    assert all((S.GONE, event) not in ALLOWED for event in E)
    with pytest.raises(InvalidTransition, match="promoted is not allowed while cold"):
        transition(S.COLD, E.PROMOTED)
