"""A tier with no driver configured: the cutover records its step there and changes nothing."""

from __future__ import annotations

from datetime import timedelta

from contract.routing_tier import RoutingTier
from cutover.drivers.step import RecordedOnlyState, RecordedOnlyTarget, StepCheck
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

    def targets(self, scope: Scope, *, generation: int | None = None) -> list[RecordedOnlyTarget]:
        return [RecordedOnlyTarget(tier=self.tier, scope=scope.key)]

    def read_state(self, target: RecordedOnlyTarget) -> RecordedOnlyState:
        return RecordedOnlyState(target=target, target_state=None)

    def desired(self, before: RecordedOnlyState, target_state: TargetState) -> RecordedOnlyState:
        return before.model_copy(update={"target_state": target_state})

    def apply(self, desired: RecordedOnlyState) -> None:
        return None

    def verify(self, expected: RecordedOnlyState, timeout: timedelta) -> StepCheck:
        return StepCheck(True, expected, {
            "recorded_only": True,
            "message": f"no {self.tier.value} driver is configured: nothing was changed at this tier",
        })
