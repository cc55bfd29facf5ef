"""Zone and region faults, from the agent's probe rounds: what the regional agent reports for automatic cutover.

An instance fault is the agent's verdict on one instance (gateways eject it
at l7 by the verdict board). A **zone fault** is every instance of one zone
failing — its probes time out or error, or its process is gone — for
`rounds` consecutive probe rounds while another zone of the region has a
healthy instance. A **region fault** is every instance of the region failing
for `rounds` rounds. One failing round is a blip and never a fault, and a
zone fault is never reported while the whole region is down: that is the
region fault, and the dns tier is the one that covers it.

    verdict                        counts as
    ok, overloaded                 healthy (it answers)
    timeout, error, gone           failing (gone: the process exited, or its lease lapsed while failing)
    draining, old_generation,      neither: a planned exit or a rollout is not a zone fault, and wrong
      wrong_output, unprobed         output is the catalog's problem (all zones share the weights)

Only instances that have been healthy once are a zone's **members**: a
cold instance still loading, or a backfill that never came up, neither
proves a zone alive nor dead. A member that leaves the agent's view while
failing stays a member, as gone, until its zone has a healthy member again;
one that leaves while healthy or draining (retired, drained) is just gone.

A fault opens once and stays open while it persists — reporting it every
round would open a cutover every round — and clears after `clear_rounds`
rounds in which its zone (region) is not down; if it returns later it is a
new fault with a new id. `FaultDetector.observe` is pure over its inputs
(the round's observations and the wall time), so tests drive it on virtual
time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from warm_pool.controlplane_post import ControlPlanePoster

GONE = "gone"  # not a probe verdict: the instance's process exited, or its lease lapsed while it failed
HEALTHY_VERDICTS = frozenset({"ok", "overloaded"})
FAILING_VERDICTS = frozenset({"timeout", "error", GONE})

FaultKind = Literal["zone", "region"]


class Health(StrEnum):
    HEALTHY = "healthy"
    FAILING = "failing"
    NEITHER = "neither"


def health_of(verdict: str | None) -> Health:
    if verdict in HEALTHY_VERDICTS:
        return Health.HEALTHY
    if verdict in FAILING_VERDICTS:
        return Health.FAILING
    return Health.NEITHER


@dataclass(frozen=True)
class Observation:
    """One instance as the agent saw it this round."""

    instance_id: str
    zone: str
    verdict: str | None  # a warm_pool.probe.Verdict value, GONE, or None (not probed yet)
    reason: str = ""
    generation: int | None = None


@dataclass
class _Member:
    zone: str
    verdict: str | None
    reason: str
    generation: int | None
    failing_since: datetime | None = None
    last_healthy_at: datetime | None = None


@dataclass(frozen=True)
class Fault:
    """A zone or region fault: `fault_id` is stable for as long as it persists (the escalation ladder's key)."""

    fault_id: str
    kind: FaultKind
    region: str
    zone: str | None
    evidence: dict[str, Any]

    @property
    def scope(self) -> str:
        return f"region:{self.region}" + (f"/zone:{self.zone}" if self.zone else "")


@dataclass
class _Open:
    fault: Fault
    clear_rounds: int = 0  # consecutive rounds its scope was not down


@dataclass(frozen=True)
class RoundResult:
    opened: tuple[Fault, ...] = ()
    cleared: tuple[Fault, ...] = ()


@dataclass
class FaultDetector:
    """Counts consecutive down rounds per zone and for the region; opens and clears faults."""

    region: str
    rounds: int = 3
    clear_rounds: int = 3
    source: str = "agent"
    members: dict[str, _Member] = field(default_factory=dict)
    open: dict[str, _Open] = field(default_factory=dict)  # scope → open fault
    _zone_down: dict[str, int] = field(default_factory=dict)
    _zone_down_since: dict[str, datetime] = field(default_factory=dict)
    _region_down: int = 0
    _region_down_since: datetime | None = None

    def __post_init__(self) -> None:
        if self.rounds < 2:
            raise ValueError("fault rounds must be at least 2: one failing round is a blip, never a fault")
        if self.clear_rounds < 1:
            raise ValueError("fault clear rounds must be at least 1")

    def observe(self, observations: Iterable[Observation], at: datetime) -> RoundResult:
        """Take one probe round (every instance the agent sees, and the ones it lost this round)."""
        self._update_members(list(observations), at)
        zones = self._zones()
        down = {z for z, (healthy, failing, neither) in zones.items() if failing and not healthy and not neither}
        healthy = {z for z, (h, _, _) in zones.items() if h}
        region_down = bool(zones) and down == set(zones)
        for zone in zones:
            if zone in down:
                self._zone_down[zone] = self._zone_down.get(zone, 0) + 1
                self._zone_down_since.setdefault(zone, at)
            else:
                self._zone_down.pop(zone, None)
                self._zone_down_since.pop(zone, None)
        for zone in [z for z in self._zone_down if z not in zones]:
            self._zone_down.pop(zone)
            self._zone_down_since.pop(zone, None)
        if region_down:
            self._region_down += 1
            self._region_down_since = self._region_down_since or at
        else:
            self._region_down, self._region_down_since = 0, None

        cleared = self._clear(down, region_down)
        opened: list[Fault] = []
        region_scope = f"region:{self.region}"
        if region_down and self._region_down >= self.rounds and region_scope not in self.open:
            opened.append(self._opened("region", None, self._region_down, self._region_down_since or at, at,
                                       healthy_zones={}))
        for zone in sorted(down):
            scope = f"{region_scope}/zone:{zone}"
            others = sorted(healthy - {zone})
            if region_down or not others or self._zone_down[zone] < self.rounds or scope in self.open:
                continue
            opened.append(self._opened("zone", zone, self._zone_down[zone], self._zone_down_since[zone], at,
                                       healthy_zones={z: self._ids(z, Health.HEALTHY) for z in others}))
        for fault in opened:
            self.open[fault.scope] = _Open(fault)
        return RoundResult(tuple(opened), tuple(cleared))

    # -- internals -----------------------------------------------------------------------------------
    def _update_members(self, observations: list[Observation], at: datetime) -> None:
        seen = set()
        for o in observations:
            seen.add(o.instance_id)
            health = health_of(o.verdict)
            member = self.members.get(o.instance_id)
            if member is None:
                if health is not Health.HEALTHY:
                    continue  # never healthy yet: proves nothing about its zone
                member = self.members[o.instance_id] = _Member(o.zone, o.verdict, o.reason, o.generation)
            member.zone, member.verdict, member.reason = o.zone, o.verdict, o.reason
            member.generation = o.generation if o.generation is not None else member.generation
            if health is Health.FAILING:
                member.failing_since = member.failing_since or at
            else:
                member.failing_since = None
            if health is Health.HEALTHY:
                member.last_healthy_at = at
        for instance_id, member in list(self.members.items()):
            if instance_id in seen:
                continue
            if health_of(member.verdict) is Health.FAILING:
                if member.verdict != GONE:
                    member.verdict, member.reason = GONE, f"left the agent's view while {member.verdict}: " \
                                                          f"{member.reason}"[:500]
            else:
                del self.members[instance_id]  # a clean departure: retired or drained
        healthy_zones = {m.zone for m in self.members.values() if health_of(m.verdict) is Health.HEALTHY}
        for instance_id, member in list(self.members.items()):
            if member.verdict == GONE and member.zone in healthy_zones:
                del self.members[instance_id]  # its zone serves again: the lost one no longer tells anything

    def _zones(self) -> dict[str, tuple[int, int, int]]:
        counts: dict[str, list[int]] = {}
        for member in self.members.values():
            c = counts.setdefault(member.zone, [0, 0, 0])
            c[[Health.HEALTHY, Health.FAILING, Health.NEITHER].index(health_of(member.verdict))] += 1
        return {z: (c[0], c[1], c[2]) for z, c in counts.items()}

    def _ids(self, zone: str | None, health: Health | None = None) -> list[str]:
        return sorted(i for i, m in self.members.items()
                      if (zone is None or m.zone == zone) and (health is None or health_of(m.verdict) is health))

    def _clear(self, down: set[str], region_down: bool) -> list[Fault]:
        cleared = []
        for scope, entry in list(self.open.items()):
            still = region_down if entry.fault.kind == "region" else entry.fault.zone in down
            entry.clear_rounds = 0 if still else entry.clear_rounds + 1
            if entry.clear_rounds >= self.clear_rounds:
                cleared.append(self.open.pop(scope).fault)
        return cleared

    def _opened(self, kind: FaultKind, zone: str | None, rounds: int, since: datetime, at: datetime, *,
                healthy_zones: dict[str, list[str]]) -> Fault:
        scope = f"region:{self.region}" + (f"/zone:{zone}" if zone else "")
        fault_id = f"{self.source}:{scope}:{since:%Y%m%dT%H%M%S.%f}Z".replace("/", ":")[:200]
        instances = [{"instance_id": i, "zone": m.zone, "verdict": m.verdict, "reason": m.reason[:500],
                      "generation": m.generation,
                      "failing_since": m.failing_since.isoformat() if m.failing_since else None}
                     for i, m in sorted(self.members.items()) if zone is None or m.zone == zone]
        evidence: dict[str, Any] = {
            "detector": "warm_pool.fault", "source": self.source, "kind": kind, "region": self.region,
            "zone": zone, "rounds": rounds, "rounds_required": self.rounds,
            "first_failed_at": since.isoformat(), "detected_at": at.isoformat(), "instances": instances}
        if kind == "zone":
            evidence["healthy_zones"] = healthy_zones
        return Fault(fault_id, kind, self.region, zone, evidence)


# ---------------------------------------------------------------- to the control plane

ESCALATIONS_PATH = "/api/v1/cutover-escalations"


def escalation_body(fault: Fault) -> dict[str, Any]:
    """The `POST /api/v1/cutover-escalations` body (cutover.schemas.EscalationRequest) for a fault."""
    scope: dict[str, Any] = {"kind": fault.kind, "region": fault.region}
    if fault.zone is not None:
        scope["name"] = fault.zone
    return {"fault_id": fault.fault_id, "scope": scope, "evidence": fault.evidence}


class FaultReporter(ControlPlanePoster):
    """Posts a fault to the control plane, which runs the escalation ladder before it answers.

    The answer waits for the cutover (each step bounded by its timeout), so the read timeout is long
    and the agent sends from a background task, never from its probe loop. Outcomes: `accepted`,
    `retry` (unreachable, a timeout, 5xx: the same fault id again resumes its ladder, never a second
    cutover), `refused` (any other 4xx: the agent gives up on that fault and says so), `disabled`.
    """

    def __init__(self, http: Any, base_url: str | None, *, token: str | None = None,
                 timeout_s: float = 120.0) -> None:
        super().__init__(http, base_url, token=token, timeout_s=timeout_s)

    async def send(self, fault: Fault) -> tuple[str, dict[str, Any] | str | None]:
        """(outcome, the control plane's answer or why not)."""
        return await self.post(ESCALATIONS_PATH, escalation_body(fault))
