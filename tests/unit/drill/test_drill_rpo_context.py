"""RPO_context from the session turns' own figures: the first turn each session finished after the fault."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from controlplane.drill.measure import RequestTrace, rpo_context
from controlplane.drill.runner import chat_messages
from controlplane.drill.schemas import Traffic

FAULT_AT = 10.0


def turn(session: str, n: int, ended: float, context: int, cached: int | None, *, cls: str = "chat",
         error: str | None = None) -> RequestTrace:
    figures = {"context_tokens": context, "cached_tokens": cached,
               "context_recomputed_tokens": None if cached is None else max(0, context - cached)}
    return RequestTrace(index=n, sampling="greedy", started_at=ended - 1, ended_at=ended, error=error,
                        session_id=session, session_class=cls, turn=n, session=figures)


def test_the_first_turn_after_the_fault_is_what_the_session_paid_not_every_turn():
    traces = [
        turn("a", 0, 5.0, 0, 0), turn("a", 1, 8.0, 70, 64),  # before the fault: ordinary partial blocks
        turn("a", 2, 14.0, 150, 144),  # resumed at the standby: the last partial block
        turn("a", 3, 16.0, 230, 224),  # after the resume: not the fault's cost
        turn("b", 0, 9.0, 0, 0), turn("b", 1, 15.0, 80, 0, cls="support"),  # nothing replicated: all of it
    ]
    traces[-1].session_class = "support"
    measured = rpo_context(traces, FAULT_AT)
    assert [(r.session_id, r.turn, r.context_recomputed_tokens) for r in measured.sessions] == [
        ("a", 2, 6), ("b", 1, 80)]
    assert measured.by_class == {"chat": 6.0, "support": 80.0}
    assert measured.tokens == 80.0  # the worst session's


def test_sessions_without_context_across_the_fault_measure_nothing():
    traces = [turn("a", 0, 12.0, 0, 0),  # a first turn after the fault: nothing to lose
              turn("b", 1, 13.0, 70, None),  # the gateway did not say what the engine restored
              turn("c", 1, 14.0, 70, 64, error="stream ended after 3 of 16 tokens"),
              turn("d", 1, 9.0, 70, 0)]  # before the fault
    measured = rpo_context(traces, FAULT_AT)
    assert measured.tokens is None and measured.sessions == [] and measured.by_class == {}


def test_a_failed_turn_after_the_fault_does_not_hide_the_next_one():
    traces = [turn("a", 2, 12.0, 150, 0, error="lost"), turn("a", 3, 15.0, 230, 224)]
    assert rpo_context(traces, FAULT_AT).tokens == 6.0


def test_each_turn_carries_the_previous_answers_and_a_follow_up():
    traffic = Traffic(prompt="Why?", sessions=True, session_turns=3, follow_ups=["More.", "Again."])
    assert chat_messages(traffic, []) == [{"role": "user", "content": "Why?"}]
    assert chat_messages(traffic, ["A1", "A2"]) == [
        {"role": "user", "content": "Why?"}, {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "More."}, {"role": "assistant", "content": "A2"},
        {"role": "user", "content": "Again."}]
    assert traffic.multi_turn and not Traffic(sessions=True).multi_turn


def test_multi_turn_traffic_without_sessions_is_refused():
    with pytest.raises(ValidationError, match="session_turns and session_classes need sessions on"):
        Traffic(session_turns=3)
