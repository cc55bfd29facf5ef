"""The plan for people (a rich table with the arithmetic) and for machines (JSON of the same numbers)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from warm_pool.capacity import CapacityPlan


def plan_json(result: CapacityPlan) -> dict[str, Any]:
    req = result.request
    return {
        "region": req.region, "tier": str(req.tier), "required_serving": result.required_serving,
        "zones": [{"zone": z.zone, "serving": z.serving, "warm": z.warm, "warm_previous": z.warm_previous}
                  for z in result.zones],
        "largest_zone": result.largest_zone, "survivors_after_zone_loss": result.survivors_after_zone_loss,
        "replay_tokens": result.replay_tokens, "replay_seconds": result.replay_seconds,
        "survives_zone_loss": result.survives_zone_loss,
        "tiers": [{"tier": str(c.tier), "serving": c.serving, "warm": c.warm, "warm_previous": c.warm_previous,
                   "loaded_instances": c.loaded_instances, "cost_ratio": round(c.cost_ratio, 3),
                   "survives_zone_loss": c.survives_zone_loss, "recovery": c.recovery} for c in result.tier_costs],
        "arithmetic": [{"name": s.name, "formula": s.formula, "value": s.value, "unit": s.unit} for s in result.steps],
    }


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
