"""RTO_latency as a sliding window's TTFT p99 (controlplane/drill/measure.py), on virtual time."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.drill import measure
from controlplane.drill.measure import RequestTrace, TtftSample

TARGET = 0.5


def steady(start: float, end: float, every: float, ttft: float) -> list[TtftSample]:
    out, at = [], start
    while at <= end:
        out.append(TtftSample(at, ttft))
        at = round(at + every, 6)
    return out


def rto(samples, *, fault_at=10.0, end_at=40.0, window_s=5.0, min_samples=5):
    return measure.rto_latency_p99(samples, fault_at=fault_at, end_at=end_at, target=TARGET, window_s=window_s,
                                   min_samples=min_samples)


def test_a_fault_that_never_moved_ttft_measures_zero():
    assert rto(steady(0.0, 40.0, 0.5, 0.1)) == 0.0


def test_recovered_once_the_last_late_sample_left_the_window():
    # Late answers (TTFT 2 s) known late at 11.0 … 13.0; good ones every 0.5 s throughout.
    samples = sorted(steady(0.0, 40.0, 0.5, 0.1) + [TtftSample(11.0 + i * 0.5, 2.0) for i in range(5)],
                     key=lambda s: s.at)
    # The last late sample (13.0) leaves the window (13.0, 18.0] at 18.0: recovered 8.0 s after the fault.
    assert rto(samples) == pytest.approx(8.0)


def test_one_late_request_keeps_p99_out_for_a_whole_window_below_a_hundred_samples():
    samples = sorted(steady(0.0, 40.0, 0.5, 0.1) + [TtftSample(12.0, 9.0)], key=lambda s: s.at)
    assert rto(samples) == pytest.approx(12.0 + 5.0 - 10.0)


def test_p99_over_a_hundred_samples_tolerates_one_late_one():
    samples = sorted(steady(0.0, 40.0, 0.01, 0.1) + [TtftSample(12.0, 9.0)], key=lambda s: s.at)
    assert rto(samples) == 0.0  # 500 samples a window: nearest-rank p99 is not the one late answer


def test_too_few_samples_is_not_within_target():
    sparse = steady(0.0, 40.0, 2.0, 0.1)  # 2-3 samples a 5 s window, min 5
    assert rto(sparse) is None
    # …and after an outage, recovery waits for min_samples good answers in the window.
    samples = [*steady(0.0, 10.0, 0.5, 0.1), *steady(20.0, 40.0, 0.5, 0.1)]
    assert rto(samples) == pytest.approx(20.0 + 2.0 - 10.0)  # the 5th sample after the gap arrives at 22.0


def test_still_out_when_the_traffic_ended_is_not_recovered():
    samples = sorted(steady(0.0, 40.0, 0.5, 0.1) + [TtftSample(38.0, math.inf)], key=lambda s: s.at)
    assert rto(samples) is None


def test_going_out_again_later_moves_recovery_past_the_second_excursion():
    samples = sorted(steady(0.0, 40.0, 0.5, 0.1) + [TtftSample(11.0, 3.0), TtftSample(25.0, 3.0)],
                     key=lambda s: s.at)
    assert rto(samples) == pytest.approx(25.0 + 5.0 - 10.0)


def test_bad_window_parameters_are_refused():
    with pytest.raises(ValueError):
        rto([], window_s=0.0)
    with pytest.raises(ValueError):
        rto([], min_samples=0)


def test_samples_are_placed_when_the_client_knew():
    good = RequestTrace(0, "greedy", started_at=1.0, token_times=[1.2], ended_at=2.0)
    late = RequestTrace(1, "greedy", started_at=1.0, token_times=[4.0], ended_at=5.0)
    waiting = RequestTrace(2, "greedy", started_at=1.0)  # no token yet, not finished
    failed_fast = RequestTrace(3, "greedy", started_at=1.0, ended_at=1.1, error="refused")
    failed_slow = RequestTrace(4, "greedy", started_at=1.0, ended_at=3.0, error="timeout")
    assert measure.ttft_samples([good, late, waiting, failed_fast, failed_slow], TARGET) == [
        TtftSample(1.1, math.inf), TtftSample(1.2, pytest.approx(0.2)), TtftSample(1.5, 3.0),
        TtftSample(1.5, math.inf), TtftSample(1.5, math.inf)]


# ---------------------------------------------------------------- properties

samples_st = st.lists(st.builds(TtftSample, at=st.floats(0.0, 60.0, allow_nan=False),
                                ttft=st.one_of(st.floats(0.0, 3.0, allow_nan=False), st.just(math.inf))),
                      max_size=60).map(lambda xs: sorted(xs, key=lambda s: s.at))
params = {"fault_at": st.floats(0.0, 30.0), "window_s": st.floats(0.5, 10.0), "min_samples": st.integers(1, 8)}


@settings(max_examples=300, deadline=None)
@given(samples=samples_st, **params)
def test_from_the_measured_time_on_every_evaluation_is_within_target(samples, fault_at, window_s, min_samples):
    end_at = 60.0
    value = measure.rto_latency_p99(samples, fault_at=fault_at, end_at=end_at, target=TARGET, window_s=window_s,
                                    min_samples=min_samples)
    evaluations = sorted(t for t in {fault_at, *(s.at for s in samples), *(s.at + window_s for s in samples)}
                         if fault_at <= t <= end_at)
    ok = {t: measure.window_within(samples, t, target=TARGET, window_s=window_s, min_samples=min_samples)
          for t in evaluations}
    if value is None:
        assert not ok[evaluations[-1]]  # out at the last evaluation
        return
    assert value >= 0.0
    recovered = min(evaluations, key=lambda t: abs(t - (fault_at + value)))  # the evaluation it names
    assert abs(recovered - (fault_at + value)) < 1e-9
    assert all(ok[t] for t in evaluations if t >= recovered)
    earlier = [t for t in evaluations if t < recovered]
    assert not earlier or not ok[earlier[-1]]  # the first such time: the evaluation just before was out


@settings(max_examples=200, deadline=None)
@given(samples=samples_st, **params, late=st.floats(0.0, 60.0))
def test_a_late_sample_added_never_makes_recovery_earlier(samples, fault_at, window_s, min_samples, late):
    kwargs = {"fault_at": fault_at, "end_at": 60.0, "target": TARGET, "window_s": window_s,
              "min_samples": min_samples}
    before = measure.rto_latency_p99(samples, **kwargs)
    after = measure.rto_latency_p99(sorted([*samples, TtftSample(late, math.inf)], key=lambda s: s.at), **kwargs)
    if after is not None:
        # Fewer than 100 samples a window here: p99 is the max, so one more late sample only delays it.
        assert before is not None and after >= before
