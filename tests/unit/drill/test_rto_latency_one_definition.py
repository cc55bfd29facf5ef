"""RTO_latency has one definition and one function, used by the drills and the demo alike."""

from __future__ import annotations

import ast
from pathlib import Path

from controlplane.drill import measure
from lifeline.demo.scenarios import StreamRun, Traffic

ROOT = Path(__file__).resolve().parents[3]
REFERENCE = [5, 6, 7]


def run(started: float, ttft: float | None, *, error: str | None = None, tokens: list[int] | None = None) -> StreamRun:
    arrivals = [] if ttft is None else [started + ttft + 0.01 * i for i in range(3)]
    ended = arrivals[-1] if arrivals else started + 0.05
    return StreamRun(token_ids=list(REFERENCE if tokens is None else tokens), arrivals=arrivals, started=started,
                     ended=ended, error=error)


def traffic(runs: list[StreamRun]) -> Traffic:
    flow = Traffic("eu", "http://127.0.0.1:1", REFERENCE)
    flow.runs = runs
    return flow


def timeline() -> list[StreamRun]:
    """0.1 s TTFT at 2 requests/s; the fault at 10 s; 3 s of failures; one quick request; a slow one; then healthy."""
    runs = [run(t / 2, 0.1) for t in range(20)]
    runs += [run(10 + t / 10, None, error="ConnectError") for t in range(30)]
    runs += [run(13.0, 0.1), run(13.5, 2.0)]
    runs += [run(16 + t / 2, 0.1) for t in range(30)]
    return runs


def test_the_demo_reports_the_drills_function_on_its_own_timeline() -> None:
    flow = traffic(timeline())
    target = flow.ttft_target()
    traces = [measure.RequestTrace(index=i, sampling="greedy", started_at=r.started, token_times=r.arrivals,
                                   token_ids=r.token_ids, ended_at=r.ended, error=r.error)
              for i, r in enumerate(flow.runs)]
    expected = measure.rto_latency(traces, fault_at=10.0, end_at=31.0, ttft_target=target)
    assert expected is not None
    assert flow.rto_latency(10.0, 31.0) == expected
    # Not "the first correct request after the fault" (13.1 s): the slow request at 13.5 s keeps p99 out.
    first_correct = flow.served_correctly_after(10.0)
    assert first_correct is not None and expected > first_correct - 10.0


def test_a_fault_that_never_hurt_ttft_measures_zero_even_if_answers_were_wrong() -> None:
    runs = [run(t / 2, 0.1) for t in range(20)] + [run(10 + t / 2, 0.1, tokens=[9, 9, 9]) for t in range(20)]
    assert traffic(runs).rto_latency(10.0, 20.0) == 0.0


def test_still_out_at_the_end_is_none() -> None:
    runs = [run(t / 2, 0.1) for t in range(20)] + [run(10 + t / 10, None, error="refused") for t in range(30)]
    assert traffic(runs).rto_latency(10.0, 13.0) is None


def test_every_rto_latency_the_demo_reports_comes_from_the_one_function() -> None:
    """Each `….rto_latency_s = …` in lifeline/demo is `Traffic.rto_latency(…)` or a drill report's figure."""
    allowed = []
    for path in sorted((ROOT / "lifeline" / "demo").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Assign):
                continue
            if not any(isinstance(t, ast.Attribute) and t.attr == "rto_latency_s" for t in node.targets):
                continue
            source = ast.unparse(node.value)
            assert ".rto_latency(" in source or source == "measured.get('rto_latency_s')", f"{path.name}: {source}"
            allowed.append(source)
    assert len(allowed) >= 5
    demo_traffic = (ROOT / "lifeline" / "demo" / "scenarios.py").read_text()
    assert "measure.rto_latency(" in demo_traffic
