"""What a drill measured, computed from the client's timeline. Pure: no I/O, no clock.

The runner records, per synthetic request, when it started, when each token
reached the client (seconds on one clock) and which token ids arrived; the
undisturbed run gives the expected ids. From those alone:

    request RTO      the largest gap between two consecutive tokens of a
                     stream that was in flight when the fault landed (gap at
                     the client; seed §2, "fault → next token reaches the client")
    token RPO        positions lost, delivered twice, or changed, against the
                     undisturbed run (greedy and seeded are token-identical
                     after migration on the same weights, so any difference
                     counts)
    requests lost    streams that ended in an error or short
    RTO_latency      fault → the first request started after it whose time to
                     first token is within the target again
    TTFT p99         nearest-rank p99 over finished requests (stop conditions)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise


@dataclass
class RequestTrace:
    index: int
    sampling: str  # "greedy" | "seeded"
    started_at: float
    token_times: list[float] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    epochs: list[int] = field(default_factory=list)
    ended_at: float | None = None
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.ended_at is not None

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.started_at if self.token_times else None


@dataclass(frozen=True)
class TokenComparison:
    lost: int
    duplicated: int
    changed: int

    @property
    def rpo_tokens(self) -> int:
        return self.lost + self.duplicated + self.changed


def compare_tokens(expected: Sequence[int], got: Sequence[int], seqs: Sequence[int] = ()) -> TokenComparison:
    """Token by token against the undisturbed run; a repeated sequence number is a duplicate delivery."""
    duplicated = len(seqs) - len(set(seqs))
    changed = sum(1 for a, b in zip(expected, got, strict=False) if a != b)
    lost = max(0, len(expected) - len(got))
    duplicated += max(0, len(got) - len(expected))
    return TokenComparison(lost=lost, duplicated=duplicated, changed=changed)


def p99(values: Sequence[float]) -> float | None:
    """Nearest-rank 99th percentile."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def error_rate(traces: Sequence[RequestTrace]) -> float:
    done = [t for t in traces if t.finished]
    return sum(1 for t in done if t.error) / len(done) if done else 0.0


def ttft_p99(traces: Sequence[RequestTrace]) -> float | None:
    return p99([t.ttft for t in traces if t.finished and t.ttft is not None])


def request_rto(traces: Sequence[RequestTrace], fault_at: float) -> float | None:
    """Largest client-side gap across the fault among streams in flight when it landed (None: none was)."""
    gaps = []
    for trace in traces:
        times = [trace.started_at, *trace.token_times]
        if not (trace.started_at <= fault_at and (trace.ended_at is None or trace.ended_at >= fault_at)):
            continue
        spanning = [b - a for a, b in pairwise(times) if b >= fault_at]
        if spanning:
            gaps.append(max(spanning))
    return max(gaps) if gaps else None


def rto_latency(traces: Sequence[RequestTrace], fault_at: float, ttft_target: float) -> float | None:
    """Fault → first token of the first request started after the fault whose TTFT is within target."""
    recovered = [t.token_times[0] for t in traces
                 if t.started_at >= fault_at and t.ttft is not None and t.ttft <= ttft_target and not t.error]
    return min(recovered) - fault_at if recovered else None


def migrated(traces: Sequence[RequestTrace]) -> int:
    """Streams whose request epoch advanced: the gateway moved them to another engine."""
    return sum(1 for t in traces if t.epochs and max(t.epochs) > 0)


@dataclass(frozen=True)
class Verdict:
    metric: str
    target: float | None
    measured: float | None
    met: bool | None  # None: not targeted by this drill


def verdicts(measured: dict[str, float | None], targets: dict[str, float | None]) -> list[Verdict]:
    """Measured vs target per metric; a targeted metric that could not be measured is not met."""
    out = []
    for metric, value in measured.items():
        target = targets.get(metric)
        if target is None:
            out.append(Verdict(metric, None, value, None))
        else:
            out.append(Verdict(metric, target, value, value is not None and value <= target))
    return out
