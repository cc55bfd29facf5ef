"""A routing system's typed `TierDriver` as the workflow's `StepDriver` (cutover/drivers/base.py has both).

The workflow stores every state as JSON (a step's expected/actual
before-state, the event's before/after) and must rebuild it after a
restart; a typed driver (BIND9 / Route 53, ExaBGP, HAProxy, Istio) takes
and returns frozen pydantic states. `TierDriverAdapter` sits between: its
typed states go out through `model_dump(mode="json")` and come back
through `parse_state`, once per call. Which targets a scope maps to (which
record, which prefix and next hop, which HAProxy servers) is deployment
configuration, so the adapter is given `targets_for` (cutover/runtime.py
builds it from the drivers file); what "out" and "in" mean per tier has
defaults (`desired_out_in`) except for DNS, where "out" means "the answer
of the region that takes over", configured, and read from the scope the
target carries (`cutover.runtime.dns_desired`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Generic

from contract.routing_tier import RoutingTier
from cutover.drivers.base import (
    AnycastState,
    DriverError,
    L7State,
    MeshState,
    S,
    StepCheck,
    Target,
    TierDriver,
    TierState,
    VerificationFailed,
    parse_state,
    parse_target,
)
from cutover.errors import MeshNoDestinationLeft
from cutover.scope import Scope, TargetState

# A step's evidence names the record as the routing system has it: a DNS target's cutover scope is left out.
_RECORD_ONLY = {"expected": {"target": {"scope"}}, "observed": {"target": {"scope"}}}


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


def desired_out_in(before: TierState, target_state: TargetState) -> TierState:
    """Default meaning of out/in for the typed states that have an obvious one (all but DNS's)."""
    if isinstance(before, MeshState):
        weights = mesh_weights(before.weights, before.target.destinations, target_state)
        return before.model_copy(update={"weights": weights, "reconciled": True})
    if isinstance(before, AnycastState):
        return before.model_copy(update={"announced": target_state == TargetState.IN})
    if isinstance(before, L7State):
        return before.model_copy(update={"admin_state": "ready" if target_state == TargetState.IN else "drain"})
    raise NotImplementedError(f"no default desired state for {type(before).__name__}; configure one")


class TierDriverAdapter(Generic[S]):
    """A typed `TierDriver` as a `StepDriver`."""

    def __init__(
        self,
        driver: TierDriver[S],
        *,
        tier: RoutingTier,
        name: str,
        targets_for: Callable[[Scope], Sequence[Target]],
        desired_for: Callable[[S, TargetState], S] = desired_out_in,  # type: ignore[assignment]
    ) -> None:
        self.driver = driver
        self.tier = tier
        self.name = name
        self._targets_for = targets_for
        self._desired_for = desired_for

    def targets(self, scope: Scope, *, generation: int | None = None) -> list[dict[str, Any]]:
        return [t.model_dump(mode="json") for t in self._targets_for(scope)]

    def read_state(self, target: dict[str, Any]) -> dict[str, Any]:
        return self.driver.read_state(parse_target(target)).model_dump(mode="json")

    def desired(self, before: dict[str, Any], target_state: TargetState) -> dict[str, Any]:
        return self._desired_for(self._typed(before), target_state).model_dump(mode="json")

    def apply(self, desired: dict[str, Any]) -> None:
        self.driver.apply(self._typed(desired))

    def _typed(self, state: Mapping[str, Any]) -> S:
        """A stored state as the driver's typed one (the tier in the JSON picks the model)."""
        return parse_state(state)  # type: ignore[return-value]

    def verify(self, expected: dict[str, Any], timeout: timedelta) -> StepCheck:
        try:
            proof = self.driver.verify(self._typed(expected), timeout)
        except VerificationFailed as exc:
            proof = exc.verification
        except DriverError as exc:
            return StepCheck(False, None, {"error": exc.error_type, "message": exc.message})
        return StepCheck(proof.verified, proof.observed.model_dump(mode="json"),
                         proof.model_dump(mode="json", exclude=_RECORD_ONLY))
