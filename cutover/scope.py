"""What a cutover moves (`Scope`: an instance, a zone or a region) and which way (`TargetState`: out or in).

Plain values, no ORM: the drivers' typed targets carry a scope (a DNS
target names the region it moves), and cutover/models.py stores those
targets in its step columns, so these cannot live in models.py without a
cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ScopeKind(StrEnum):
    INSTANCE = "instance"
    ZONE = "zone"
    REGION = "region"


@dataclass(frozen=True)
class Scope:
    """What a cutover moves: one instance, zone or region (a row stores it as scope_kind, region, scope_name)."""

    kind: ScopeKind
    region: str
    name: str  # the zone or instance id; the region's own name for a region scope

    @property
    def key(self) -> str:
        """The event log's scope string, as topology writes it."""
        if self.kind == ScopeKind.REGION:
            return f"region:{self.region}"
        return f"region:{self.region}/{self.kind.value}:{self.name}"


class TargetState(StrEnum):
    OUT = "out"  # take the scope out of routing at this tier
    IN = "in"  # return it
