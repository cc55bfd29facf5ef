"""What the cutover workflow needs from a tier, and the adapter onto `cutover.driver`.

The workflow stores every state as JSON (a step's expected/actual
before-state, the event's before/after) and must rebuild it after a
restart, so it speaks to tiers through `StepDriver`, whose states are
JSON dicts that carry their own target:

    targets(scope)            what this tier changes for the scope (planning)
    read_state(target)        the real state now
    desired(before, target)   the state the tier should show after the step
    apply(desired)            write it (idempotent: a resumed step writes it again)
    verify(expected, timeout) poll until the tier shows it → StepCheck (never raises
                              on a mismatch; a driver error is a failed check)

`TierDriverAdapter` wraps any `cutover.driver.TierDriver` (BIND9 / Route 53,
ExaBGP, HAProxy): its typed states go through `model_dump(mode="json")`
and come back through `cutover.driver.parse_state`. Which targets a scope
maps to (which record, which prefix and next hop, which HAProxy servers) is
deployment configuration, so the adapter is given `targets_for`; what "out"
and "in" mean per tier has defaults (`desired_out_in`) except for DNS,
where "out" means "the answer of the region that takes over" and must be
configured.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

from controlplane.event.models import RoutingTier
from cutover.models import CutoverTier, ScopeKind, TargetState


@dataclass(frozen=True)
class Scope:
    kind: ScopeKind
    region: str
    name: str  # the zone or instance id; the region's own name for a region scope

    @property
    def key(self) -> str:
        """The event log's scope string, as topology writes it."""
        if self.kind == ScopeKind.REGION:
            return f"region:{self.region}"
        return f"region:{self.region}/{self.kind.value}:{self.name}"


@dataclass(frozen=True)
class StepCheck:
    verified: bool
    observed: dict[str, Any] | None
    evidence: dict[str, Any] = field(default_factory=dict)


class StepDriver(Protocol):
    tier: CutoverTier
    name: str

    def targets(self, scope: Scope, *, generation: int | None = None) -> list[dict[str, Any]]: ...

    def read_state(self, target: dict[str, Any]) -> dict[str, Any]: ...

    def desired(self, before: dict[str, Any], target_state: TargetState) -> dict[str, Any]: ...

    def apply(self, desired: dict[str, Any]) -> None: ...

    def verify(self, expected: dict[str, Any], timeout: timedelta) -> StepCheck: ...


def event_tier(tier: CutoverTier | str) -> RoutingTier:
    """The event log's routing_tier for a cutover tier (the same four names)."""
    return RoutingTier(CutoverTier(tier).value)


def describe_target(target: Mapping[str, Any]) -> str:
    """A short, stable label for a step's driver_target column."""
    parts = [f"{k}={target[k]}" for k in sorted(target) if k != "tier"]
    return ",".join(parts)[:400]


def apportion(shares: Mapping[str, float], total: int) -> dict[str, int]:
    """Integer weights summing to `total` in proportion to `shares` (largest remainder; ties by name)."""
    mass = sum(shares.values())
    if mass <= 0:
        shares, mass = {k: 1.0 for k in shares}, float(len(shares))
    exact = {k: v * total / mass for k, v in shares.items()}
    floors = {k: int(v) for k, v in exact.items()}
    left = total - sum(floors.values())
    for k in sorted(exact, key=lambda k: (-(exact[k] - floors[k]), k))[:left]:
        floors[k] += 1
    return floors


def mesh_weights(weights: Mapping[str, int], moved: Sequence[str], target_state: TargetState) -> dict[str, int]:
    """A weighted route with the scope's destinations `moved` out (to 0) or back in; the total is kept.

    out: the moved ones get 0 and the others share the total in proportion
    to what they had (an error if none had any). in: each moved destination
    gets an even share (total / destinations) and the others the rest in
    proportion. A rollback does not use this: it restores the recorded weights.
    """
    from cutover.errors import MeshNoDestinationLeft

    total = sum(weights.values()) or 100
    unknown = sorted(set(moved) - set(weights))
    if unknown:
        raise MeshNoDestinationLeft(f"the route has no destination {unknown}; it has {sorted(weights)}",
                                    type="mesh_unknown_destination")
    others = {k: float(v) for k, v in weights.items() if k not in moved}
    if target_state == TargetState.OUT:
        if not any(others.values()):
            raise MeshNoDestinationLeft(
                f"taking {sorted(moved)} out leaves the route no destination with weight (it has {dict(weights)})")
        return {**apportion(others, total), **{k: 0 for k in moved}}
    even = total / len(weights)
    rest = total - even * len(moved)
    shares = {k: even for k in moved}
    if others:
        mass = sum(others.values())
        shares |= {k: (v / mass if mass else 1 / len(others)) * rest for k, v in others.items()}
    return apportion(shares, total)


def desired_out_in(before: Any, target_state: TargetState) -> Any:
    """Default meaning of out/in for the `cutover.driver` states that have an obvious one."""
    from cutover.driver import AnycastState, L7State, MeshState

    if isinstance(before, MeshState):
        weights = mesh_weights(before.weights, before.target.destinations, target_state)
        return before.model_copy(update={"weights": weights, "reconciled": True})
    if isinstance(before, AnycastState):
        return before.model_copy(update={"announced": target_state == TargetState.IN})
    if isinstance(before, L7State):
        return before.model_copy(update={"admin_state": "ready" if target_state == TargetState.IN else "drain"})
    raise NotImplementedError(f"no default desired state for {type(before).__name__}; configure one")


class TierDriverAdapter:
    """A `cutover.driver.TierDriver` as a `StepDriver`."""

    def __init__(
        self,
        driver: Any,
        *,
        tier: CutoverTier,
        name: str,
        targets_for: Callable[[Scope], list[Any]],
        desired_for: Callable[[Any, TargetState], Any] = desired_out_in,
    ) -> None:
        self.driver = driver
        self.tier = tier
        self.name = name
        self._targets_for = targets_for
        self._desired_for = desired_for

    def targets(self, scope: Scope, *, generation: int | None = None) -> list[dict[str, Any]]:
        return [t.model_dump(mode="json") for t in self._targets_for(scope)]

    def read_state(self, target: dict[str, Any]) -> dict[str, Any]:
        from cutover.driver import parse_target

        return self.driver.read_state(parse_target(target)).model_dump(mode="json")

    def desired(self, before: dict[str, Any], target_state: TargetState) -> dict[str, Any]:
        from cutover.driver import parse_state

        return self._desired_for(parse_state(before), target_state).model_dump(mode="json")

    def apply(self, desired: dict[str, Any]) -> None:
        from cutover.driver import parse_state

        self.driver.apply(parse_state(desired))

    def verify(self, expected: dict[str, Any], timeout: timedelta) -> StepCheck:
        from cutover.driver import DriverError, VerificationFailed, parse_state

        try:
            proof = self.driver.verify(parse_state(expected), timeout)
        except VerificationFailed as exc:
            proof = exc.verification
        except DriverError as exc:
            return StepCheck(False, None, {"error": exc.error_type, "message": exc.message})
        return StepCheck(proof.verified, proof.observed.model_dump(mode="json"), proof.model_dump(mode="json"))


class ScopedTierDriverAdapter(TierDriverAdapter):
    """A TierDriverAdapter whose desired state depends on the scope, not only on the state before.

    DNS is the case: one record answers for every region, and "region eu
    out" means "the answer of the region that takes over from eu", which
    the record's current answer cannot tell. Each target carries its scope
    (`"scope": {...}`) through planning and the stored step; it is removed
    before the typed driver sees the target.
    """

    def __init__(self, driver: Any, *, tier: CutoverTier, name: str, targets_for: Callable[[Scope], list[Any]],
                 desired_for: Callable[[Any, TargetState, Scope], Any]) -> None:
        super().__init__(driver, tier=tier, name=name, targets_for=targets_for)
        self._scoped_desired_for = desired_for

    @staticmethod
    def _split(target: Mapping[str, Any]) -> tuple[dict[str, Any], Scope]:
        plain = {k: v for k, v in target.items() if k != "scope"}
        scope = target["scope"]
        return plain, Scope(ScopeKind(scope["kind"]), scope["region"], scope["name"])

    def _typed(self, state: Mapping[str, Any]) -> Any:
        from cutover.driver import parse_state

        return parse_state({**state, "target": self._split(state["target"])[0]})

    def _dump(self, typed: Any, target: Mapping[str, Any]) -> dict[str, Any]:
        return {**typed.model_dump(mode="json"), "target": dict(target)}

    def targets(self, scope: Scope, *, generation: int | None = None) -> list[dict[str, Any]]:
        where = {"kind": scope.kind.value, "region": scope.region, "name": scope.name}
        return [{**t.model_dump(mode="json"), "scope": where} for t in self._targets_for(scope)]

    def read_state(self, target: dict[str, Any]) -> dict[str, Any]:
        from cutover.driver import parse_target

        return self._dump(self.driver.read_state(parse_target(self._split(target)[0])), target)

    def desired(self, before: dict[str, Any], target_state: TargetState) -> dict[str, Any]:
        scope = self._split(before["target"])[1]
        return self._dump(self._scoped_desired_for(self._typed(before), target_state, scope), before["target"])

    def apply(self, desired: dict[str, Any]) -> None:
        self.driver.apply(self._typed(desired))

    def verify(self, expected: dict[str, Any], timeout: timedelta) -> StepCheck:
        from cutover.driver import DriverError, VerificationFailed

        try:
            proof = self.driver.verify(self._typed(expected), timeout)
        except VerificationFailed as exc:
            proof = exc.verification
        except DriverError as exc:
            return StepCheck(False, None, {"error": exc.error_type, "message": exc.message})
        return StepCheck(proof.verified, self._dump(proof.observed, expected["target"]), proof.model_dump(mode="json"))


RECORDED_ONLY = "recorded-only"


class RecordedOnlyDriver:
    """A tier with no driver configured: the cutover records its step, and changes nothing there.

    The served control plane plans every tier it is asked for; where no
    driver is configured, the step says "recorded only" (the plan lists such
    tiers under `recorded_only`), its event names it, and it verifies at
    once: an operator acts on that tier by hand, and the decision, actor and
    time are in the log. The safety rules still count the cutover.
    """

    name = RECORDED_ONLY

    def __init__(self, tier: CutoverTier) -> None:
        self.tier = tier

    def targets(self, scope: Scope, *, generation: int | None = None) -> list[dict[str, Any]]:
        return [{"tier": self.tier.value, "recorded_only": True, "scope": scope.key}]

    def read_state(self, target: dict[str, Any]) -> dict[str, Any]:
        return {"target": target, "target_state": None}

    def desired(self, before: dict[str, Any], target_state: TargetState) -> dict[str, Any]:
        return {**before, "target_state": target_state.value}

    def apply(self, desired: dict[str, Any]) -> None:
        return None

    def verify(self, expected: dict[str, Any], timeout: timedelta) -> StepCheck:
        return StepCheck(True, expected, {
            "recorded_only": True,
            "message": f"no {self.tier.value} driver is configured: nothing was changed at this tier",
        })
