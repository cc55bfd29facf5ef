"""The probe budget: inference probes cost real GPU time, so the region spends at most so many per second.

Health-check traffic above a tenth of the instance count per second shows up
in production latency. So, cluster-wide:

    rate   = instances × per_instance_per_s      (0.1 by default: each instance once per 10 s)
    bucket = a token bucket at `rate`, holding max(rate × burst_s, 1) tokens (a bucket that cannot hold
             one token never sends one: fewer than 10 instances at the defaults)
             → in any window of W seconds, probes ≤ rate × W + max(rate × burst_s, 1)

Each instance has its own due time, first drawn uniformly over one interval
(so 30 instances that appear together are not probed together) and then
`interval × (1 ± jitter)` after each probe. An instance that served real
traffic successfully (the gateways' reports) counts as probed at that time
and is not due again until an interval later — but never later than
`served_credit_intervals` (2) intervals after its last canary. Served
traffic proves the engine answers, not that the answer is right: an engine
with corrupted weights answers 200 and earns credit with every wrong reply,
so unbounded credit would keep the one check that catches it from ever
running (the demo measured 8–45 s of wrong answers before ejection, with up
to 140 served). The cap keeps "a corrupted engine is canaried within two
intervals" true under any traffic, and still saves up to half the canaries
of busy instances. When more are due than the bucket holds, the longest
overdue go first. Liveness/readiness/generation probes
are HTTP GETs without inference and are not budgeted.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from common.clock import Clock


class ProbeBudget:
    def __init__(self, clock: Clock, *, per_instance_per_s: float = 0.1, jitter: float = 0.2,
                 burst_s: float = 1.0, served_credit_intervals: float = 2.0,
                 rng: random.Random | None = None) -> None:
        if not 0 < per_instance_per_s:
            raise ValueError(f"per_instance_per_s must be > 0, got {per_instance_per_s!r}")
        if not 0 <= jitter < 1:
            raise ValueError(f"jitter must be within [0, 1), got {jitter!r}")
        if not served_credit_intervals >= 1:
            raise ValueError(f"served_credit_intervals must be >= 1, got {served_credit_intervals!r}")
        self.clock = clock
        self.per_instance_per_s = per_instance_per_s
        self.jitter = jitter
        self.burst_s = burst_s
        self.rng = rng or random.Random()
        self.tokens = 0.0
        self.refilled_at = clock.now()
        self.served_credit_intervals = served_credit_intervals
        self.due_at: dict[str, float] = {}
        # How far served traffic may push each instance's canary: its scheduled due time plus
        # (served_credit_intervals - 1) intervals, so the cap carries the schedule's spread and busy
        # instances seen together do not all fall due in one burst at their cap.
        self.credit_until: dict[str, float] = {}
        self.probes_sent = 0
        self.skipped_as_served = 0

    @property
    def interval_s(self) -> float:
        return 1.0 / self.per_instance_per_s

    def rate(self, instances: int) -> float:
        """Inference probes per second the region may spend with `instances` instances."""
        return instances * self.per_instance_per_s

    def _next(self, after: float) -> float:
        return after + self.interval_s * (1 + self.rng.uniform(-self.jitter, self.jitter))

    def _schedule(self, instance_id: str, due_at: float) -> None:
        self.due_at[instance_id] = due_at
        self.credit_until[instance_id] = due_at + (self.served_credit_intervals - 1) * self.interval_s

    def note_served(self, instance_id: str, at: float) -> None:
        """Real traffic succeeded on `instance_id` at monotonic `at`: it counts as a probe then, within the cap."""
        if instance_id in self.due_at:
            pushed = min(self._next(at), self.credit_until[instance_id])
            if pushed > self.due_at[instance_id]:
                self.due_at[instance_id] = pushed
                self.skipped_as_served += 1

    def due(self, instances: Iterable[str]) -> list[str]:
        """The instances to send a canary to now; each one returned has been charged to the budget."""
        now = self.clock.now()
        current = set(instances)
        for gone in set(self.due_at) - current:
            del self.due_at[gone], self.credit_until[gone]
        for new in sorted(current - set(self.due_at)):
            self._schedule(new, now + self.rng.uniform(0, self.interval_s))
        rate = self.rate(len(current))
        self.tokens = min(max(rate * self.burst_s, 1.0), self.tokens + (now - self.refilled_at) * rate)
        self.refilled_at = now
        ready = sorted((at, i) for i, at in self.due_at.items() if at <= now)
        chosen = [i for _, i in ready[:int(self.tokens)]]
        self.tokens -= len(chosen)
        for instance_id in chosen:
            self._schedule(instance_id, self._next(now))
        self.probes_sent += len(chosen)
        return chosen
