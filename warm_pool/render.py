"""The plan for people (a rich table with the arithmetic) and for machines (JSON of the same numbers)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from warm_pool.capacity import CapacityPlan, record_of


def plan_json(result: CapacityPlan) -> dict[str, Any]:
    """The same record the control plane answers on `/api/v1/pool/plan` (contract.pool_plan.PlanRecord)."""
    return record_of(result).model_dump(mode="json")


def print_plan(result: CapacityPlan, console: Console | None = None) -> None:
    console = console or Console()
    req = result.request
    zones = Table(title=f"{req.region}: {req.tier} plan, headroom {req.headroom:g}, "
                        f"recovery target {req.recovery_target_s:g} s")
    for column in ("zone", "serving", "warm", "warm (previous version)", "loaded"):
        zones.add_column(column, justify="right" if column != "zone" else "left")
    for z in result.zones:
        zones.add_row(z.zone, str(z.serving), str(z.warm), str(z.warm_previous), str(z.loaded))
    zones.add_row("total", str(result.serving), str(result.warm),
                  str(sum(z.warm_previous for z in result.zones)), str(sum(z.loaded for z in result.zones)),
                  style="bold")
    console.print(zones)

    math_table = Table(title="arithmetic")
    for column in ("step", "how", "value", "unit"):
        math_table.add_column(column)
    for step in result.steps:
        math_table.add_row(step.name, step.formula, f"{step.value:g}", step.unit)
    console.print(math_table)

    tiers = Table(title="DR tiers for this demand")
    for column in ("tier", "serving", "warm", "loaded", "× serving", "survives zone loss", "recovery"):
        tiers.add_column(column)
    for c in result.tier_costs:
        tiers.add_row(str(c.tier), str(c.serving), str(c.warm + c.warm_previous), str(c.loaded_instances),
                      f"{c.cost_ratio:.2f}", "yes" if c.survives_zone_loss else "no", c.recovery,
                      style="bold" if c.tier == req.tier else None)
    console.print(tiers)
    verdict = ("survives" if result.survives_zone_loss else "does NOT survive")
    console.print(f"The region {verdict} losing its largest zone ({result.largest_zone}): "
                  f"{result.survivors_after_zone_loss} instances left for {result.required_serving} needed; "
                  f"replay {result.replay_tokens:.0f} tokens in {result.replay_seconds:.2f} s.")
