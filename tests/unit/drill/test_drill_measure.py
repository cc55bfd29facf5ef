"""Drill measurements from a client timeline, on virtual time (pure functions)."""

from __future__ import annotations

import pytest

from controlplane.drill import measure
from controlplane.drill.measure import RequestTrace
from controlplane.drill.runner import stop_condition_tripped
from controlplane.drill.schemas import StopConditions


def trace(index, start, times, ids=None, *, end=None, error=None, epochs=None):
    ids = ids if ids is not None else list(range(len(times)))
    return RequestTrace(index=index, sampling="greedy", started_at=start, token_times=list(times), token_ids=ids,
                        seqs=list(range(len(ids))), epochs=epochs or [0] * len(ids),
                        ended_at=end if end is not None else (times[-1] if times else start), error=error)


def test_identical_tokens_have_zero_rpo():
    assert measure.compare_tokens([1, 2, 3], [1, 2, 3], [0, 1, 2]).rpo_tokens == 0


@pytest.mark.parametrize(("got", "seqs", "lost", "duplicated", "changed"), [
    ([1, 2], [0, 1], 1, 0, 0),  # a gap: the last token never came
    ([1, 2, 2, 3], [0, 1, 1, 2], 0, 2, 1),  # delivered twice (seq repeated), so the tail shifts
    ([1, 9, 3], [0, 1, 2], 0, 0, 1),  # changed after migration: semantic recovery broken
])
def test_token_rpo_counts_gaps_duplicates_and_changes(got, seqs, lost, duplicated, changed):
    comparison = measure.compare_tokens([1, 2, 3], got, seqs)
    assert (comparison.lost, comparison.duplicated, comparison.changed) == (lost, duplicated, changed)


def test_request_rto_is_the_largest_gap_across_the_fault():
    in_flight = trace(0, 0.0, [0.1, 0.2, 0.3, 1.8, 1.9])  # fault at 0.35: gap 0.3 → 1.8
    before = trace(1, 0.0, [0.05, 0.1])  # ended before the fault: not counted
    assert measure.request_rto([in_flight, before], fault_at=0.35) == pytest.approx(1.5)
    assert measure.request_rto([before], fault_at=0.35) is None


def test_p99_is_nearest_rank():
    assert measure.p99([float(i) for i in range(1, 101)]) == 99.0
    assert measure.p99([]) is None


def test_targeted_metric_not_measured_is_not_met():
    verdicts = {v.metric: v for v in measure.verdicts({"a": 1.0, "b": None, "c": 5.0}, {"a": 2.0, "b": 1.0})}
    assert verdicts["a"].met is True
    assert verdicts["b"].met is False
    assert verdicts["c"].met is None


def test_stop_condition_trips_on_error_rate():
    ok, bad = trace(0, 0.0, [0.1]), trace(1, 0.0, [], end=0.5, error="boom")
    stops = StopConditions(max_error_rate=0.4, min_requests=2)
    assert stop_condition_tripped(stops, [ok]) is None  # too few finished to judge
    assert "error rate 0.50" in stop_condition_tripped(stops, [ok, bad])


def test_stop_condition_trips_on_ttft_p99():
    stops = StopConditions(max_error_rate=None, ttft_p99_ms=100.0)
    assert stop_condition_tripped(stops, [trace(0, 0.0, [0.05])]) is None
    assert "TTFT p99 250.0 ms" in stop_condition_tripped(stops, [trace(0, 0.0, [0.05]), trace(1, 0.0, [0.25])])
