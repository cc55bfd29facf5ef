"""Automatic escalation: which tier acts on a fault, and when the next one up takes over.

The ladder takes the smallest scope that can remove the fault first, and
widens only when that scope's tiers failed or had nothing to change:

    rung  scope     tiers            acts on
    0     instance  l7               the instance's generation (ejected through the snapshot)
    1     zone      anycast + mesh   the zone's prefix (BGP withdraw) and its mesh routes
    2     zone      l7               the zone's clusters, drained in the snapshot gateways route by
    3     region    dns              the region's record — for a region fault only

    fault scope   first rung
    instance      0
    zone          1
    region        3 (every zone tier's scope is exceeded)

An attempt escalates one rung **only when its verification failed** (a
step did not verify, or no longer showed its after-state: the cutover
rolled back or failed with that failure) **or its tiers had nothing to
change for the scope** (no anycast driver, or none for that zone, and no
mesh route naming it; no cluster in the zone for l7; the rung is skipped,
which is an event, not a cutover). A zone fault with no anycast driver and
no mesh route is drained at l7 — the snapshot can take just that zone's
clusters out — and the region stays where it is.

**A region move needs the evidence of a region fault.** The ladder never
climbs from a zone rung to dns for an instance or zone fault: a zone its
zone tiers could not contain holds there and says so, and the region moves
when a detector (the region's agent seeing every zone down, a person, an
observer outside the region) reports the region itself. Before this, a
zone fault with nothing to change at anycast and mesh went straight to a
region-wide DNS cutover, moving every healthy zone's traffic with it.

An attempt that a safety rule refused or that is still running holds the
ladder where it is: a larger blast radius would not be safer than what
the rule or the operator decided. So does one at a tier with no driver
configured (recorded only, in the served control plane): it "verified"
without changing anything, so it contains nothing, and the hold says a
person must act there; and a skip to a rung with no driver holds before
planning anything there. An instance rung with nothing to change holds
too: l7 can always eject a generation, so the report lacked it, and a
malformed report never widens to a zone. After dns there is no rung left.

`decide(fault, attempts)` is pure (table-tested);
`cutover.escalation_flow.escalate(runtime, fault, actor)` runs it against
the cutover records: it plans and executes each automatic cutover it
decides on — `mode=automatic`, with evidence that names the fault (its
source and observations) and, for an escalation, the attempt it escalates
from (cutover id or none for a skip, tier, scope, outcome, failure) — and
stops at the first decision that is not a cutover. An automatic cutover
without evidence is refused (`EvidenceRequired`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from contract.routing_tier import RoutingTier
from cutover.errors import EvidenceRequired
from cutover.scope import Scope, ScopeKind


class Outcome(StrEnum):
    VERIFIED = "verified"
    VERIFICATION_FAILED = "verification_failed"
    REFUSED = "refused"  # a safety rule refused it
    NOTHING_TO_CHANGE = "nothing_to_change"  # the rung's tiers had no target for the scope: no cutover was made
    IN_PROGRESS = "in_progress"
    RECORDED_ONLY = "recorded_only"  # completed, but no driver is configured there: nothing was changed


class Action(StrEnum):
    CUT_OVER = "cut_over"
    SKIPPED = "skipped"  # the rung's tiers had nothing to change for its scope: the next rung up acts
    CONTAINED = "contained"  # an attempt verified: nothing more to do
    HOLD = "hold"  # an attempt was refused or is running: do not escalate past it
    EXHAUSTED = "exhausted"  # dns did not verify either: no tier left


@dataclass(frozen=True)
class Fault:
    """What a detector (probe, canary, agent report, operator) saw; `id` ties the attempts together."""

    id: str
    scope: Scope
    evidence: Mapping[str, Any]
    zone: str | None = None  # an instance fault: the instance's zone, to escalate to
    generation: int | None = None  # an instance fault: the endpoint generation l7 ejects through the snapshot


@dataclass(frozen=True)
class Attempt:
    """One rung tried for the fault: an automatic cutover as its record shows it, or a skip (`cutover_id` None)."""

    cutover_id: int | None
    rung: int
    tier: RoutingTier
    scope: Scope
    outcome: Outcome
    failure: str | None = None


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    rung: int | None = None
    tiers: tuple[RoutingTier, ...] = ()
    scope: Scope | None = None
    evidence: dict[str, Any] = field(default_factory=dict)


# rung → the tiers that act there, in order (the first is the cutover's tier), and the scope they act on
RUNGS: tuple[tuple[RoutingTier, ...], ...] = (
    (RoutingTier.L7,), (RoutingTier.ANYCAST, RoutingTier.MESH), (RoutingTier.L7,), (RoutingTier.DNS,))
_SCOPE_OF_RUNG = (ScopeKind.INSTANCE, ScopeKind.ZONE, ScopeKind.ZONE, ScopeKind.REGION)
FIRST_RUNG = {ScopeKind.INSTANCE: 0, ScopeKind.ZONE: 1, ScopeKind.REGION: 3}
_WHY_FIRST = {
    ScopeKind.INSTANCE: "the fastest tier that covers one instance",
    ScopeKind.ZONE: "the zone's own tiers first (anycast + mesh, then l7's zone drain); the region is not moved "
                    "for a zone",
    ScopeKind.REGION: "a region fault exceeds l7's, mesh's and anycast's scope (they act per zone or less)",
}


def _scope_at(fault: Fault, rung: int) -> Scope | None:
    kind = _SCOPE_OF_RUNG[rung]
    if kind == fault.scope.kind:
        return fault.scope
    if kind == ScopeKind.ZONE:
        return Scope(ScopeKind.ZONE, fault.scope.region, fault.zone) if fault.zone else None
    return Scope(ScopeKind.REGION, fault.scope.region, fault.scope.region)


def fault_evidence(fault: Fault) -> dict[str, Any]:
    """The fault as its cutovers and events name it; an instance fault with the generation it judged."""
    named: dict[str, Any] = {"id": fault.id, "scope": fault.scope.key}
    if fault.scope.kind == ScopeKind.INSTANCE:
        named["generation"] = fault.generation
    return {"fault": {**named, **dict(fault.evidence)}}


def decide(fault: Fault, attempts: Sequence[Attempt]) -> Decision:
    """The next step for `fault` given the rungs tried for it (its automatic cutovers and skips, oldest first)."""
    if not fault.evidence:
        raise EvidenceRequired("an automatic cutover must name the evidence that triggered it")
    if not attempts:
        rung = FIRST_RUNG[fault.scope.kind]
        return Decision(Action.CUT_OVER, f"{fault.scope.kind.value} fault: {_WHY_FIRST[fault.scope.kind]}",
                        rung, RUNGS[rung], fault.scope, fault_evidence(fault))
    last = max(attempts, key=lambda a: a.rung)
    described = (f"cutover #{last.cutover_id} ({last.tier.value}, {last.scope.key})" if last.cutover_id is not None
                 else f"{last.tier.value} for {last.scope.key}")
    if last.outcome == Outcome.VERIFIED:
        return Decision(Action.CONTAINED, f"{described} verified")
    if last.outcome == Outcome.IN_PROGRESS:
        return Decision(Action.HOLD, f"{described} is still running")
    if last.outcome == Outcome.REFUSED:
        return Decision(Action.HOLD, f"{described} was refused ({last.failure}); not escalating past a refusal")
    if last.outcome == Outcome.RECORDED_ONLY:
        return Decision(Action.HOLD, f"{described} changed nothing: no {last.tier.value} driver is configured "
                                     "(recorded only); a person must act at that tier")
    failed = "did not verify"
    if last.outcome == Outcome.NOTHING_TO_CHANGE:
        failed = "had nothing to change"
        if last.rung == FIRST_RUNG[ScopeKind.INSTANCE]:
            return Decision(Action.HOLD, f"{described} had nothing to change ({last.failure}): l7 ejects an "
                                         "instance by its generation; a report without it does not widen to a zone")
    rung = last.rung + 1
    if rung >= len(RUNGS):
        return Decision(Action.EXHAUSTED, f"{described} {failed} and no tier is left above dns")
    if _SCOPE_OF_RUNG[rung] == ScopeKind.REGION and fault.scope.kind != ScopeKind.REGION:
        return Decision(Action.HOLD, f"{described} {failed}, and no tier smaller than the region is left; a region "
                                     f"move needs the evidence of a region fault: report region:{fault.scope.region} "
                                     "itself to move it at dns")
    scope = _scope_at(fault, rung)
    if scope is None:
        return Decision(Action.HOLD, f"{described} {failed}, and the fault does not name the zone to escalate to")
    evidence = {**fault_evidence(fault), "escalated_from": {
        "cutover_id": last.cutover_id, "tier": last.tier.value, "scope": last.scope.key,
        "outcome": last.outcome.value, "failure": last.failure}}
    return Decision(Action.CUT_OVER, f"{described} {failed}: escalating to {RUNGS[rung][0].value}",
                    rung, RUNGS[rung], scope, evidence)
