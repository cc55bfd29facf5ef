"""Safety rules checked before a cutover starts and before each of its steps.

ARC's two kinds, plus one against flapping:

    gating      gating.stop_switch       a global stop switch (table cutover_gate) is on
    assertion   assertion.serving_region taking the scope out leaves some model with no
                                         region serving it (serving = an active cluster
                                         with weight > 0 outside every scope that a
                                         cutover holds out, this one included)
    assertion   assertion.capacity       capacity left < demand × headroom (only when a
                                         capacity plan is configured; skipped otherwise)
    wait        wait.min_interval        the scope's last cutover ended less than
                                         `min_wait` ago (not when that one was an
                                         earlier rung of the same automatic
                                         escalation: see `_same_escalation`)

Only taking a scope out is checked by the assertions; putting one back in
cannot reduce what serves. Rollback and zonal-shift expiry are never
blocked: they restore recorded, known-good state. Break-glass (admin and a
reason) overrides every rule and is recorded as its own event.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy.orm import Session

from common.clock import Clock
from cutover import repository
from cutover.models import Cutover
from cutover.scope import Scope, ScopeKind, TargetState
from cutover.policy import CutoverPolicy, aware


class CapacityPlan(Protocol):
    def capacity_after(self, removed: list[Scope]) -> tuple[float, float] | None:
        """(capacity left, demand) once `removed` scopes serve nothing; None if the plan has no figure."""
        ...


@dataclass(frozen=True)
class Violation:
    rule: str
    message: str
    retry_after_s: float | None = None

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"rule": self.rule, "message": self.message}
        if self.retry_after_s is not None:
            body["retry_after_s"] = round(self.retry_after_s, 3)
        return body


def scope_of(cutover: Cutover) -> Scope:
    return Scope(ScopeKind(cutover.scope_kind), cutover.region, cutover.scope_name)


def _covers(scope: Scope, region: str, zone: str | None) -> bool:
    if scope.kind == ScopeKind.REGION:
        return region == scope.region
    if scope.kind == ScopeKind.ZONE:
        return region == scope.region and zone == scope.name
    return False  # one instance: the cluster keeps serving through its other instances


def serving_regions(session: Session, removed: Iterable[Scope]) -> dict[str, set[str]]:
    """model → regions with an active, weighted cluster outside every removed scope."""
    from controlplane.topology import repository as topology
    from controlplane.topology.models import ClusterState

    removed = list(removed)
    serving: dict[str, set[str]] = {}
    for cluster in topology.list_clusters(session, model=None, region=None):
        regions = serving.setdefault(cluster.model, set())
        if cluster.state != ClusterState.ACTIVE or cluster.weight <= 0:
            continue
        if any(_covers(scope, cluster.region, cluster.zone) for scope in removed):
            continue
        regions.add(cluster.region)
    return serving


def gate_stopped(session: Session) -> tuple[bool, str]:
    gate = repository.get_gate(session)
    return (bool(gate and gate.stopped), gate.reason if gate else "")


def evaluate(
    session: Session,
    *,
    cutover: Cutover,
    policy: CutoverPolicy,
    clock: Clock,
    capacity: CapacityPlan | None = None,
    include_wait: bool = True,
) -> list[Violation]:
    violations: list[Violation] = []
    stopped, why = gate_stopped(session)
    if stopped:
        violations.append(Violation("gating.stop_switch", f"the cutover stop switch is on: {why}"))

    if cutover.target_state == TargetState.OUT:
        others = [scope_of(c) for c in repository.holding_out(session, exclude_id=cutover.id)]
        scope = scope_of(cutover)
        before = serving_regions(session, others)
        after = serving_regions(session, [*others, scope])
        stranded = sorted(model for model, regions in before.items() if regions and not after.get(model))
        if stranded:
            violations.append(Violation(
                "assertion.serving_region",
                f"taking {scope.key} out leaves no region serving {', '.join(stranded)}",
            ))
        if capacity is not None:
            figures = capacity.capacity_after([*others, scope])
            if figures is not None:
                left, demand = figures
                if left < demand * policy.headroom:
                    violations.append(Violation(
                        "assertion.capacity",
                        f"capacity left {left:g} < demand {demand:g} × headroom {policy.headroom:g}",
                    ))

    if include_wait:
        last = repository.last_ended_for_scope(session, scope=cutover.scope, exclude_id=cutover.id)
        if last is not None and last.ended_at is not None and not _same_escalation(last, cutover):
            elapsed = (clock.utcnow() - aware(last.ended_at)).total_seconds()
            wait = policy.min_wait.total_seconds()
            if elapsed < wait:
                violations.append(Violation(
                    "wait.min_interval",
                    f"cutover #{last.id} of {cutover.scope} ended {elapsed:.0f}s ago; wait {wait:.0f}s between "
                    "cutovers of one scope",
                    retry_after_s=wait - elapsed,
                ))
    return violations


def _same_escalation(earlier: Cutover, cutover: Cutover) -> bool:
    """Both automatic cutovers of one fault's ladder (`evidence.fault.id`): the next rung, not a flap.

    A zone's rung at anycast + mesh that did not verify rolls back, and the
    ladder's next rung drains the same zone at l7 at once: the wait between
    cutovers of one scope is there against a scope flapping in and out, and
    holding the smaller-scope tier back for `min_wait` after a failed attempt
    would leave the fault uncontained for that long.
    """
    def fault_id(c: Cutover) -> Any:
        return ((c.evidence or {}).get("fault") or {}).get("id") if c.mode == "automatic" else None

    return fault_id(earlier) is not None and fault_id(earlier) == fault_id(cutover)
