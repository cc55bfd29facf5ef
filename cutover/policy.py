"""Tunables of the cutover workflow, as timedeltas (STYLE: durations are timedelta).

Built once by the composition root and passed down; the defaults are the
ones the tests and docs/cutover.md describe. A served control plane reads
them from the `[policy]` table of its cutover drivers file
(`cutover.drivers_file.PolicyConfig`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta


@dataclass(frozen=True)
class CutoverPolicy:
    # Anti-flapping: no new cutover of a scope sooner than this after the last one of it ended.
    min_wait: timedelta = timedelta(minutes=5)
    # How long a runner's claim outlives its current step; after that another runner may resume.
    claim_ttl: timedelta = timedelta(seconds=60)
    # A step that does not verify within this fails the cutover (per plan, overridable).
    step_timeout: timedelta = timedelta(seconds=30)
    # Capacity left after the change must be ≥ demand × headroom (when a capacity plan exists).
    headroom: float = 1.2
    # ARC's rule: a zonal shift always ends by itself, at most this long after it starts.
    max_zonal_shift: timedelta = timedelta(hours=72)
    # How often the control plane looks for zonal shifts that are due.
    expiry_interval: timedelta = timedelta(seconds=5)
    # Per tier (its value: "dns", …), overriding step_timeout: Route 53 can take a minute to be INSYNC.
    tier_step_timeouts: Mapping[str, timedelta] = field(default_factory=dict)

    def step_timeout_for(self, tier: str) -> timedelta:
        return self.tier_step_timeouts.get(str(tier), self.step_timeout)


def aware(value: datetime) -> datetime:
    """`value` as an aware UTC time. The columns are `UTCDateTime` (aware on both databases); this still guards
    a value set in memory before it was flushed and read back."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
