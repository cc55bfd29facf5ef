"""A model's pool declares its DR tier and capacity inputs (`pool.plan`); the agent keeps exactly the plan's layout."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pydantic import ValidationError

from common.clock import ManualClock
from contract.pool_plan import PlanInputs
from tests.unit.warm_pool.test_pool_agent import Fleet, make_agent, settle
from warm_pool.capacity import plan_record
from warm_pool.settings import AgentSettings
from warm_pool.states import InstanceState

# tests/unit/warm_pool/test_pool_capacity.py's hand-worked case, two zones: N = 9, serving [5, 4], warm [4, 5]
PLAN = {"zones": ["x", "y"], "demand_seqs": 100, "demand_tokens_per_s": 9000, "context_tokens": 500,
        "instance_seqs": 64, "instance_tokens_per_s": 1000, "instance_prefill_tokens_per_s": 5000,
        "headroom": 1.0, "recovery_target_s": 30.0}


def pool(tmp_path: Path, **plan) -> dict:
    return {"model": "m", "versions": {"v1": str(tmp_path)}, "state_dir": str(tmp_path), "plan": {**PLAN, **plan}}


@pytest.mark.parametrize(("tier", "share"), [("warm", 0.0), ("hot", 0.0), ("cold", 0.0), ("warm", 0.5)])
def test_the_pool_keeps_the_plan_of_its_tier(tmp_path: Path, tier: str, share: float) -> None:
    settings = AgentSettings(region="r1", pool=pool(tmp_path, tier=tier, previous_version_share=share))
    record = plan_record(PlanInputs(region="r1", **{**PLAN, "tier": tier, "previous_version_share": share}))
    assert {z: (t.serving, t.warm, t.warm_previous) for z, t in settings.pool.zones.items()} == {
        z.zone: (z.serving, z.warm, z.warm_previous) for z in record.zones}
    assert settings.pool.plan_record == record and settings.pool.tier == tier


@pytest.mark.parametrize(("change", "names"), [
    ({"instance_seqs": 0}, "pool.plan.instance_seqs"),
    ({"zones": ["x"]}, "pool.plan.zones"),
    ({"headroom": 0.5}, "pool.plan.headroom"),
    ({"tier": "lukewarm"}, "pool.plan.tier"),
    ({"demand_seqs": "many"}, "pool.plan.demand_seqs"),
    ({"region": "r2"}, "pool.plan.region"),
])
def test_a_plan_the_pool_cannot_use_stops_start_up_naming_the_key(tmp_path: Path, change: dict, names: str) -> None:
    with pytest.raises(ValidationError, match=names.replace(".", r"\.")):
        AgentSettings(region="r1", pool=pool(tmp_path, **change))


def test_zones_or_a_plan_not_both_nor_neither(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="pool.zones or pool.plan"):
        AgentSettings(region="r1", pool={**pool(tmp_path), "zones": {"x": {"serving": 1, "warm": 1}}})
    with pytest.raises(ValidationError, match="pool.zones or pool.plan"):
        AgentSettings(region="r1", pool={k: v for k, v in pool(tmp_path).items() if k != "plan"})


async def test_the_agent_fills_the_plans_layout(tmp_path: Path) -> None:
    clock, fleet = ManualClock(), Fleet()
    small = {"demand_seqs": 6, "demand_tokens_per_s": 150, "context_tokens": 40, "instance_seqs": 4,
             "instance_tokens_per_s": 100, "instance_prefill_tokens_per_s": 1000, "recovery_target_s": 5.0}
    agent, registry, _ = make_agent(fleet, clock, pool=pool(tmp_path, **small))
    await settle(agent, clock, 4)
    layout = Counter((i.zone, i.state) for i in agent.instances.values())
    expected = {(z, s): n for z, t in agent.settings.pool.zones.items()
                for s, n in ((InstanceState.SERVING, t.serving), (InstanceState.WARM, t.warm)) if n}
    assert layout == Counter(expected) and len(await registry.live()) == agent.settings.pool.plan_record.required_serving


def test_the_agent_logs_its_tier_and_the_arithmetic_that_sized_it_at_start(tmp_path: Path) -> None:
    from structlog.testing import capture_logs

    from warm_pool.cli import log_plan

    settings = AgentSettings(region="r1", pool=pool(tmp_path, tier="warm"))
    with capture_logs() as logs:
        log_plan(settings.pool)
    [line] = [entry for entry in logs if entry["event"] == "pool sized by its plan"]
    record = settings.pool.plan_record
    assert line["tier"] == "warm" and line["zones"] == {z.zone: [z.serving, z.warm, z.warm_previous]
                                                         for z in record.zones}
    assert line["arithmetic"] == [f"{step.name}: {step.formula}" for step in record.arithmetic]
    assert "required serving N: max(2, 9, 1)" in line["arithmetic"]  # the hand-worked case's N = 9
