"""A tier with no driver configured: the cutover records its step there and changes nothing."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from contract.routing_tier import RoutingTier
from cutover.drivers.base import StepCheck
from cutover.scope import Scope, TargetState

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

    def __init__(self, tier: RoutingTier) -> None:
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
