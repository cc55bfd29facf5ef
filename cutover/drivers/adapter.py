"""A routing system's typed `TierDriver` as the workflow's `StepDriver` (cutover/drivers/base.py and step.py).

A typed driver (BIND9 / Route 53, ExaBGP, HAProxy, Istio) and the workflow
speak the same states: the step's are the driver's models, parsed once
when the step is loaded (cutover/models.py). `TierDriverAdapter` adds what
the workflow asks and a routing system cannot know: the driver's name,
which targets a scope maps to (which record, which prefix and next hop,
which HAProxy servers: deployment configuration, so the adapter is given
`targets_for`, which cutover/runtime.py builds from the drivers file) and
what "out" and "in" mean per tier (`desired_out_in`, except for DNS, where
"out" means "the answer of the region that takes over", configured, read
from the scope its target carries: `cutover.runtime.dns_desired`). Its
`verify` turns the driver's `Verification`, or its error, into a `StepCheck`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Generic

from contract.routing_tier import RoutingTier
from cutover.drivers.base import (
    AnycastState,
    DriverError,
    L7State,
    MeshState,
    S,
    Target,
    TierDriver,
    TierState,
    VerificationFailed,
)
from cutover.drivers.step import StepCheck
from cutover.errors import MeshNoDestinationLeft
from cutover.scope import Scope, TargetState

# A step's evidence names the record as the routing system has it: a DNS target's cutover scope is left out.
_WITHOUT_SCOPE = {"expected": {"target": {"scope"}}, "observed": {"target": {"scope"}}}


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
    """A typed `TierDriver` as a `StepDriver`: its states in and out as they are."""

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

    def targets(self, scope: Scope, *, generation: int | None = None) -> list[Target]:
        return list(self._targets_for(scope))

    def read_state(self, target: Target) -> S:
        return self.driver.read_state(target)

    def desired(self, before: S, target_state: TargetState) -> S:
        return self._desired_for(before, target_state)

    def apply(self, desired: S) -> None:
        self.driver.apply(desired)

    def verify(self, expected: S, timeout: timedelta) -> StepCheck:
        try:
            proof = self.driver.verify(expected, timeout)
        except VerificationFailed as exc:
            proof = exc.verification
        except DriverError as exc:
            return StepCheck(False, None, {"error": exc.error_type, "message": exc.message})
        return StepCheck(proof.verified, proof.observed, proof.model_dump(mode="json", exclude=_WITHOUT_SCOPE))
