"""What a drill measured, computed from the client's timeline. Pure: no I/O, no clock.

The runner records, per synthetic request, when it started, when each token
reached the client (seconds on one clock) and which token ids arrived; the
undisturbed run gives the expected ids. From those alone:

    request RTO      the largest gap between two consecutive tokens of a
                     stream that was in flight when the fault landed (gap at
                     the client: fault → next token reaches the client)
    token RPO        positions lost, delivered twice, or changed, against the
                     undisturbed run (greedy and seeded are token-identical
                     after migration on the same weights, so any difference
                     counts)
    requests lost    streams that ended in an error or short
    detection        fault → the first routing-tier event, the fault stamped
                     when its action returned (`detection`, below)
    RTO_latency      until TTFT p99 is back within target: fault →
                     the first time from which a sliding window's p99 of
                     client-side TTFT stays within the target to the end of
                     the traffic (`rto_latency`, below). The one definition:
                     the drills and the demo (`lifeline/demo`) both call it;
                     the demo used to report "the first correct request
                     after the fault" under the same name.
    TTFT p99         nearest-rank p99 over finished requests (stop conditions)
    RPO_context      per session, the context re-prefilled by the first turn it
                     finished after the fault (`rpo_context`, below); the worst
                     session's, overall and per session class

RTO_latency's window. Every request is one TTFT sample, placed at the moment
the client *knew* whether it was within target: a request whose first token
came within the target at that token's arrival; one whose first token came
late, or never (an error, a stream still waiting), at `started + target`, the
moment it went over, with value +inf when no token ever came. (Placing a late
sample at its arrival would hide an outage: while nothing arrives, nothing
would be evaluated.) The window at time u is the samples in (u − window_s, u];
it is *within target* when it holds at least `min_samples` samples and their
nearest-rank p99 is ≤ the target (below 100 samples nearest-rank p99 is the
window's maximum, so one late request keeps the window out for `window_s`).
Too few samples is not within target: no figure without evidence. The window
is evaluated at the fault, at every sample time and every time a sample
leaves the window (t + window_s), up to the end of the traffic; RTO_latency is
the first of those times after which every evaluation is within target,
minus the fault: 0 if the fault never moved p99 out, None if it was still out
when the traffic ended. Samples before the fault count in the windows that
reach back over it, so a fault that never hurt TTFT measures 0, not "time to
collect `min_samples`". Defaults (`RTO_LATENCY_WINDOW_S`,
`RTO_LATENCY_MIN_SAMPLES`, a drill's `Targets.ttft_window_s` and
`ttft_window_min_samples`): 5 s and 5 samples, about 10 samples a window at a
drill's usual two streams of ~1 s each.
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
    attempts: int = 1  # > 1: the client sent it again after an attempt failed (traffic.retry_for_s)
    discarded_tokens: int = 0  # tokens abandoned attempts had delivered (the retry delivers them again)
    gateways: list[str] = field(default_factory=list)  # where each attempt went (re-resolved per attempt)
    # A session turn (traffic.sessions): which session, which turn (0 first), its class, the answer's text
    # (the next turn's messages carry it) and the gateway's `lifeline.session` figures for the last attempt.
    session_id: str | None = None
    session_class: str | None = None
    turn: int = 0
    text: str = ""
    session: dict | None = None

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


@dataclass(frozen=True)
class TtftSample:
    """One request's time to first token, placed when the client knew whether it was within target."""

    at: float
    ttft: float  # math.inf: no token ever came


def ttft_samples(traces: Sequence[RequestTrace], ttft_target: float) -> list[TtftSample]:
    """Each request as a `TtftSample` (see the module docstring for where a late one is placed)."""
    out = []
    for t in traces:
        ttft = t.ttft
        if ttft is not None and ttft <= ttft_target:
            out.append(TtftSample(t.token_times[0], ttft))
        elif ttft is not None or t.error or not t.finished:
            # Late, failed before a token, or still waiting: over target from started + target on.
            at = t.started_at + ttft_target
            if ttft is None and t.ended_at is not None and t.ended_at < at:
                at = t.ended_at  # failed fast: known bad when it failed
            out.append(TtftSample(at, ttft if ttft is not None else math.inf))
    return sorted(out, key=lambda s: s.at)


def window_within(samples: Sequence[TtftSample], at: float, *, target: float, window_s: float,
                  min_samples: int) -> bool:
    """The window (at − window_s, at]: at least `min_samples` samples and nearest-rank p99 ≤ target."""
    values = [s.ttft for s in samples if at - window_s < s.at <= at]
    if len(values) < min_samples:
        return False
    value = p99(values)
    return value is not None and value <= target


def rto_latency_p99(samples: Sequence[TtftSample], *, fault_at: float, end_at: float, target: float,
                    window_s: float = 5.0, min_samples: int = 5) -> float | None:
    """Fault → the first time from which the sliding window's TTFT p99 stays within target until `end_at`.

    0.0 if it never left the target; None if it was out at the last evaluation (not recovered, or too
    few samples to say). Evaluated at the fault, each sample time and each time a sample leaves the
    window, within [fault_at, end_at].
    """
    if window_s <= 0 or min_samples < 1:
        raise ValueError("window_s must be > 0 and min_samples ≥ 1")
    times = {fault_at} | {s.at for s in samples} | {s.at + window_s for s in samples}
    evaluations = sorted(t for t in times if fault_at <= t <= end_at)
    recovered_at: float | None = None
    for at in evaluations:
        if window_within(samples, at, target=target, window_s=window_s, min_samples=min_samples):
            if recovered_at is None:
                recovered_at = at
        else:
            recovered_at = None
    return None if recovered_at is None else recovered_at - fault_at


RTO_LATENCY_WINDOW_S = 5.0
RTO_LATENCY_MIN_SAMPLES = 5


def rto_latency(traces: Sequence[RequestTrace], *, fault_at: float, end_at: float, ttft_target: float,
                window_s: float = RTO_LATENCY_WINDOW_S, min_samples: int = RTO_LATENCY_MIN_SAMPLES) -> float | None:
    """RTO_latency of `traces` (client timelines on one clock): fault → TTFT p99 back within `ttft_target` for good.

    The one function behind the word, for drills and the demo alike: each request becomes a `TtftSample`
    (`ttft_samples`) and the sliding window decides (`rto_latency_p99`). 0.0: TTFT never left the target (a
    fault that hurt only quality shows in token RPO, not here); None: still out, or too few samples, at `end_at`.
    """
    return rto_latency_p99(ttft_samples(traces, ttft_target), fault_at=fault_at, end_at=end_at, target=ttft_target,
                           window_s=window_s, min_samples=min_samples)


def since_fault(offset: float, *, injection_s: float = 0.0) -> bool:
    """Whether a routing event `offset` seconds from the fault can be a response to it.

    The fault is stamped when its action returned (`runner.stamp_fault`), so an event written while the action
    was still running (a zone's first engine suppressed before its last was killed) has an offset down to
    −`injection_s`: the fault had taken effect for it. Earlier events are another fault's (the tail of the
    drill before, shipped late by a loaded data plane).
    """
    return offset >= -(injection_s + 0.001)


def detection(event_offsets: Sequence[float], *, injection_s: float = 0.0) -> float | None:
    """Fault → the first routing-tier event that responds to it (offsets in seconds from the fault, in log
    order), at 0 for one written while the fault's action ran; None: none came."""
    return next((max(0.0, offset) for offset in event_offsets if since_fault(offset, injection_s=injection_s)),
                None)


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


@dataclass(frozen=True)
class SessionResume:
    """The first turn a session finished after the fault, and the context it re-prefilled."""

    session_id: str
    session_class: str | None
    turn: int
    context_tokens: int
    cached_tokens: int
    context_recomputed_tokens: int


@dataclass(frozen=True)
class RpoContext:
    tokens: float | None  # the worst session's; None: no session carried context across the fault
    by_class: dict[str, float]
    sessions: list[SessionResume]


def rpo_context(traces: Sequence[RequestTrace], fault_at: float) -> RpoContext:
    """RPO_context, from what the gateway said of each session turn (`lifeline.session`).

    Every turn re-prefills some context (the prefix cache holds whole blocks), so the gateways' count over
    all turns is not what the fault cost. What it cost a session is what its first turn finished after the
    fault re-prefilled: that turn found only what had survived (at a standby, what had been replicated).
    A session counts only if that turn carried context (a first turn has none to lose) and the gateway
    said what the engine restored; without one such session there is no figure (no evidence).
    """
    first: dict[str, RequestTrace] = {}
    for trace in sorted(traces, key=lambda t: (t.ended_at is None, t.ended_at or 0.0)):
        if (trace.session_id is None or trace.error or trace.ended_at is None or trace.ended_at <= fault_at
                or trace.session_id in first):
            continue
        first[trace.session_id] = trace
    resumes = []
    for session_id, trace in sorted(first.items()):
        figures = trace.session or {}
        context, recomputed = figures.get("context_tokens"), figures.get("context_recomputed_tokens")
        if not context or recomputed is None:
            continue
        resumes.append(SessionResume(session_id=session_id, session_class=trace.session_class, turn=trace.turn,
                                     context_tokens=int(context), cached_tokens=int(figures.get("cached_tokens") or 0),
                                     context_recomputed_tokens=int(recomputed)))
    by_class: dict[str, float] = {}
    for resume in resumes:
        name = resume.session_class or "default"
        by_class[name] = max(by_class.get(name, 0.0), float(resume.context_recomputed_tokens))
    worst = max((float(r.context_recomputed_tokens) for r in resumes), default=None)
    return RpoContext(tokens=worst, by_class=by_class, sessions=resumes)
