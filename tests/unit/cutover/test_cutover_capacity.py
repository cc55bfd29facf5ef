"""The capacity assertion's figures from warm_pool plans."""

from __future__ import annotations

from cutover.capacity import WarmPoolCapacity
from cutover.scope import Scope, ScopeKind
from warm_pool.capacity import InstanceCapacity, PlanRequest, RegionDemand, plan


def region_plan(region: str, zones: tuple[str, ...], seqs: float) -> object:
    return plan(PlanRequest(
        region=region, zones=zones,
        instance=InstanceCapacity(concurrent_sequences=10, decode_tokens_per_s=1000, prefill_tokens_per_s=10_000),
        demand=RegionDemand(concurrent_sequences=seqs, decode_tokens_per_s=100, context_tokens_per_sequence=100),
    ))


def test_no_plans_means_no_figures() -> None:
    assert WarmPoolCapacity([]).capacity_after([]) is None


def test_a_zone_out_removes_its_serving_and_warm_instances() -> None:
    eu = region_plan("eu", ("eu-a", "eu-b", "eu-c"), seqs=100)
    capacity = WarmPoolCapacity([eu])
    total, demand = capacity.capacity_after([])
    assert demand == 100
    assert total == sum(z.serving + z.warm for z in eu.zones) * 10  # type: ignore[attr-defined]
    less, _ = capacity.capacity_after([Scope(ScopeKind.ZONE, "eu", "eu-a")])
    zone_a = eu.zone("eu-a")  # type: ignore[attr-defined]
    assert total - less == (zone_a.serving + zone_a.warm) * 10
    # The plan is sized to survive one zone's loss: what is left still covers demand × headroom.
    assert less >= demand * 1.2


def test_a_region_out_leaves_only_the_others_capacity_for_all_the_demand() -> None:
    eu = region_plan("eu", ("eu-a", "eu-b"), seqs=300)
    us = region_plan("us", ("us-a", "us-b"), seqs=100)
    left, demand = WarmPoolCapacity([eu, us]).capacity_after([Scope(ScopeKind.REGION, "eu", "eu")])
    assert demand == 400
    assert left == sum(z.serving + z.warm for z in us.zones) * 10  # type: ignore[attr-defined]
    assert left < demand * 1.2  # a region sized for its own load cannot take a larger region's
