"""The assertion rule's capacity figures from warm_pool's capacity plans.

`WarmPoolCapacity` answers `cutover.safety.CapacityPlan`: given the scopes a
cutover would leave out of routing, the concurrent sequences the remaining
zones can carry — each zone's serving and warm instances (warm ones are
promoted on loss; instances kept warm on the previous weight version are
not counted, they hold other weights) × one instance's concurrent
sequences — and the demand, summed over the planned regions. The rule then
refuses when capacity < demand × headroom.

Global, not per region: a region cut out sends its demand to the others, so
what must hold is the total. Regions without a plan contribute neither
capacity nor demand.

The served control plane and the CLI build it from the drivers file's
`[[capacity.plans]]` (`CapacityConfig`): one table per region with the
inputs `lifeline pool plan` and `/api/v1/pool/plan` take, under the same
names, so the assertion counts the instances the warm-pool plan keeps.
A plan no plan can be made of stops start-up naming the table and input.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from contract.pool_plan import PlanInputs
from cutover.scope import Scope, ScopeKind
from warm_pool.capacity import CapacityPlan, PlanError, plan_inputs


class WarmPoolCapacity:
    def __init__(self, plans: Iterable[CapacityPlan]) -> None:
        self.plans = list(plans)

    def capacity_after(self, removed: list[Scope]) -> tuple[float, float] | None:
        if not self.plans:
            return None
        capacity = demand = 0.0
        for plan in self.plans:
            request = plan.request
            demand += request.demand.concurrent_sequences
            for zone in plan.zones:
                if any(_covers(scope, request.region, zone.zone) for scope in removed):
                    continue
                capacity += (zone.serving + zone.warm) * request.instance.concurrent_sequences
        return capacity, demand


def _covers(scope: Scope, region: str, zone: str) -> bool:
    if scope.kind == ScopeKind.REGION:
        return scope.region == region
    if scope.kind == ScopeKind.ZONE:
        return scope.region == region and scope.name == zone
    return False


class RegionPlanInputs(PlanInputs):
    """One region's warm-pool plan inputs (`lifeline pool plan`'s names); refused if no plan can be made of them."""

    @model_validator(mode="after")
    def _plannable(self) -> RegionPlanInputs:
        try:
            plan_inputs(self)
        except PlanError as exc:  # names the input: "instance_seqs must be a finite number > 0, got 0"
            raise ValueError(str(exc)) from None
        return self


class CapacityConfig(BaseModel):
    """`[[capacity.plans]]` of the drivers file: the plans whose figures `assertion.capacity` checks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    plans: list[RegionPlanInputs] = Field(min_length=1)

    @field_validator("plans")
    @classmethod
    def _one_per_region(cls, plans: list[RegionPlanInputs]) -> list[RegionPlanInputs]:
        regions = [p.region for p in plans]
        if len(set(regions)) != len(regions):
            raise ValueError(f"one plan per region, got regions {regions}")
        return plans

    def build(self) -> WarmPoolCapacity:
        return WarmPoolCapacity(plan_inputs(p) for p in self.plans)
