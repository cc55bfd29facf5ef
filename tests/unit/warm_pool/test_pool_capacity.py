"""The capacity plan, worked by hand in each row: the arithmetic in warm_pool/capacity.py's docstring."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.pool_plan import DrTier
from warm_pool.capacity import InstanceCapacity, PlanError, PlanRequest, RegionDemand, _replay, plan

THREE = ("a", "b", "c")
INST = InstanceCapacity(concurrent_sequences=32, decode_tokens_per_s=800, prefill_tokens_per_s=4000)
DEMAND = RegionDemand(concurrent_sequences=200, decode_tokens_per_s=5000, context_tokens_per_sequence=1000)


def request(**overrides) -> PlanRequest:
    base = dict(region="r1", zones=THREE, instance=INST, demand=DEMAND, headroom=1.2, recovery_target_s=10.0)
    return PlanRequest(**{**base, **overrides})


# N = max(⌈200×1.2/32⌉, ⌈5000×1.2/800⌉) = 8 in the first rows; serving [3, 3, 2].
# warm, 10 s:  t=4 → survivors 8; replay 75 seqs × 1000 = 75 000 tok ÷ ((3 + 5×0.21875) × 4000) = 4.58 s.
# warm, 2 s:   t=4: 4.58 s, t=5: 3.08 s, t=6: 2.32 s, t=7: 75 000 ÷ 40 375 = 1.86 s.
# hot:         standby [3, 3, 2] on top → t=6, warm [3, 3, 4].
# two zones:   N = max(⌈100/64⌉, ⌈9000/1000⌉) = 9, serving [5, 4], t=9 → warm [4, 5].
@pytest.mark.parametrize(("name", "overrides", "serving", "warm", "previous", "survives", "replay_s"), [
    ("warm, 10 s target", {}, [3, 3, 2], [1, 1, 2], [0, 0, 0], True, 75_000 / 16_375),
    ("warm, 2 s target needs more warm", {"recovery_target_s": 2.0}, [3, 3, 2], [4, 4, 5], [0, 0, 0], True, 75_000 / 40_375),
    ("hot keeps a full standby", {"tier": DrTier.HOT}, [3, 3, 2], [3, 3, 4], [0, 0, 0], True, None),
    ("cold holds nothing and does not survive", {"tier": DrTier.COLD}, [3, 3, 2], [0, 0, 0], [0, 0, 0], False, None),
    ("previous version share rides on top", {"previous_version_share": 0.5}, [3, 3, 2], [1, 1, 2], [1, 1, 1], True, None),
    ("token-bound two zones", {"zones": ("x", "y"), "headroom": 1.0, "recovery_target_s": 30.0,
                               "instance": InstanceCapacity(64, 1000, 5000),
                               "demand": RegionDemand(100, 9000, 500)}, [5, 4], [4, 5], [0, 0], True, None),
    ("no demand still keeps one serving and one warm", {"zones": ("x", "y"), "demand": RegionDemand(0, 0, 0)},
     [1, 0], [0, 1], [0, 0], True, 0.0),
])
def test_plan_table(name, overrides, serving, warm, previous, survives, replay_s) -> None:
    result = plan(request(**overrides))
    assert [z.serving for z in result.zones] == serving, name
    assert [z.warm for z in result.zones] == warm, name
    assert [z.warm_previous for z in result.zones] == previous, name
    assert result.survives_zone_loss is survives, name
    if replay_s is not None:
        assert result.replay_seconds == pytest.approx(replay_s), name


def test_plan_prices_every_tier_in_loaded_instances() -> None:
    costs = {c.tier: c for c in plan(request()).tier_costs}
    assert {t: (c.loaded_instances, c.survives_zone_loss) for t, c in costs.items()} == {
        DrTier.HOT: (18, True), DrTier.WARM: (12, True), DrTier.COLD: (8, False)}
    assert costs[DrTier.WARM].cost_ratio == pytest.approx(1.5)


def test_plan_names_the_largest_zone_with_the_most_in_flight() -> None:
    result = plan(request())
    assert result.largest_zone == "a"
    assert result.survivors_after_zone_loss == 8
    assert [s.name for s in result.steps][:3] == ["serving by sequences", "serving by tokens", "required serving N"]


@pytest.mark.parametrize(("overrides", "names"), [
    ({"zones": ()}, "zones"),
    ({"zones": ("a", "a")}, "zones"),
    ({"zones": ("a",)}, "two or more"),
    ({"headroom": 0.9}, "headroom"),
    ({"previous_version_share": 1.5}, "previous_version_share"),
    ({"recovery_target_s": 0.0}, "recovery_target_s"),
    ({"instance": InstanceCapacity(0, 800, 4000)}, "instance.concurrent_sequences"),
    ({"demand": RegionDemand(-1, 10, 10)}, "demand.concurrent_sequences"),
    ({"demand": RegionDemand(10, math.nan, 10)}, "demand.decode_tokens_per_s"),
])
def test_plan_refuses_inputs_naming_them(overrides, names) -> None:
    with pytest.raises(PlanError, match=names):
        plan(request(**overrides))


def test_plan_refuses_a_target_no_region_can_meet() -> None:
    with pytest.raises(PlanError, match="recovery_target_s"):
        plan(request(recovery_target_s=1e-9))


def test_one_zone_region_may_plan_cold() -> None:
    result = plan(request(zones=("only",), tier=DrTier.COLD))
    assert result.survives_zone_loss is False
    assert [z.serving for z in result.zones] == [8]


@settings(max_examples=150, deadline=None)
@given(
    zones=st.integers(2, 6),
    seqs=st.integers(1, 128), tok=st.floats(10, 5000), prefill=st.floats(1000, 50_000),
    demand_seqs=st.floats(0, 2000), demand_tok=st.floats(0, 100_000), ctx=st.floats(0, 4000),
    headroom=st.floats(1, 2), target=st.floats(1, 60), tier=st.sampled_from([DrTier.WARM, DrTier.HOT]),
)
def test_losing_any_zone_leaves_demand_served_and_replay_within_target(
        zones, seqs, tok, prefill, demand_seqs, demand_tok, ctx, headroom, target, tier) -> None:
    req = PlanRequest(region="r", zones=tuple(f"z{i}" for i in range(zones)),
                      instance=InstanceCapacity(seqs, tok, prefill), demand=RegionDemand(demand_seqs, demand_tok, ctx),
                      headroom=headroom, recovery_target_s=target, tier=tier)
    result = plan(req)
    serving = [z.serving for z in result.zones]
    totals = [z.serving + z.warm for z in result.zones]
    assert sum(serving) == result.required_serving
    assert result.required_serving * seqs >= demand_seqs * headroom - 1e-6
    assert result.required_serving * tok >= demand_tok * headroom * (1 - 1e-9)
    for lost in range(zones):  # every zone, not only the one the plan calls largest
        assert sum(totals) - totals[lost] >= result.required_serving
        _, _, seconds = _replay(req, result.required_serving, serving, totals, lost)
        assert seconds <= target + 1e-9


def test_pool_plan_command_prints_the_plan_as_json() -> None:
    import json

    from typer.testing import CliRunner

    from warm_pool.cli import pool_app

    result = CliRunner().invoke(pool_app, [
        "plan", "--region", "r1", "--zones", "a,b,c", "--demand-seqs", "200", "--demand-tokens-per-s", "5000",
        "--context-tokens", "1000", "--instance-seqs", "32", "--instance-tokens-per-s", "800",
        "--instance-prefill-tokens-per-s", "4000", "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert [(z["zone"], z["serving"], z["warm"]) for z in body["zones"]] == [("a", 3, 1), ("b", 3, 1), ("c", 2, 2)]
    assert body["survives_zone_loss"] is True
    assert "replay time" in [step["name"] for step in body["arithmetic"]]


def test_pool_plan_command_names_a_bad_input() -> None:
    from typer.testing import CliRunner

    from warm_pool.cli import pool_app

    result = CliRunner().invoke(pool_app, [
        "plan", "--region", "r1", "--zones", "a", "--demand-seqs", "1", "--demand-tokens-per-s", "1",
        "--context-tokens", "1", "--instance-seqs", "1", "--instance-tokens-per-s", "1",
        "--instance-prefill-tokens-per-s", "1"])
    assert result.exit_code == 2
    assert "two or more" in result.output


FLAGS = dict(region="r1", zones="a,b,c", demand_seqs=200, demand_tokens_per_s=5000, context_tokens=1000,
             instance_seqs=32, instance_tokens_per_s=800, instance_prefill_tokens_per_s=4000)


def test_plan_record_is_the_plan_with_its_arithmetic() -> None:
    from contract.pool_plan import PlanInputs
    from warm_pool.capacity import plan_record

    record = plan_record(PlanInputs(**FLAGS))
    result = plan(request())
    assert [(z.zone, z.serving, z.warm) for z in record.zones] == [(z.zone, z.serving, z.warm) for z in result.zones]
    assert [(s.name, s.formula, s.value) for s in record.arithmetic] == [
        (s.name, s.formula, s.value) for s in result.steps]
    assert record.replay_seconds == pytest.approx(75_000 / 16_375)
    assert {t.tier: t.loaded_instances for t in record.tiers} == {DrTier.HOT: 18, DrTier.WARM: 12, DrTier.COLD: 8}


@pytest.mark.parametrize(("zones", "expected"), [
    ("a,b,c", ["a", "b", "c"]), (" a , b ,", ["a", "b"]), (["a", "b"], ["a", "b"]), (["a,b", "c"], ["a", "b", "c"]),
])
def test_plan_inputs_take_zones_as_a_list_or_comma_separated(zones, expected) -> None:
    from contract.pool_plan import PlanInputs

    assert PlanInputs(**{**FLAGS, "zones": zones}).zones == expected


@pytest.mark.parametrize(("overrides", "param", "says"), [
    ({"instance_seqs": 0}, "instance_seqs", "instance_seqs must be a finite number > 0, got 0"),
    ({"context_tokens": -1}, "context_tokens", "context_tokens must be"),
    ({"demand_tokens_per_s": math.inf}, "demand_tokens_per_s", "demand_tokens_per_s must be a finite number"),
    ({"zones": "a"}, "zones", "two or more"),
    ({"zones": "a,a"}, "zones", "each zone once"),
    ({"headroom": 0.5}, "headroom", "headroom must be ≥ 1"),
    ({"recovery_target_s": 1e-9}, "recovery_target_s", "no plan up to"),
])
def test_plan_inputs_name_the_input_a_plan_cannot_use(overrides, param, says) -> None:
    from contract.pool_plan import PlanInputs
    from warm_pool.capacity import plan_record

    with pytest.raises(PlanError) as caught:
        plan_record(PlanInputs(**{**FLAGS, **overrides}))
    assert caught.value.param == param
    assert says in str(caught.value)


def test_a_replay_nothing_can_absorb_is_none_not_infinity() -> None:
    from contract.pool_plan import PlanInputs
    from warm_pool.capacity import plan_record

    # cold, demand filling both instances exactly: the survivor has no spare share and there is no warm
    record = plan_record(PlanInputs(**{**FLAGS, "zones": "a,b", "demand_seqs": 64, "demand_tokens_per_s": 1,
                                       "headroom": 1.0, "tier": "cold"}))
    assert record.replay_seconds is None and record.survives_zone_loss is False
    assert [s.value for s in record.arithmetic if s.name == "replay time"] == [None]
    assert "Infinity" not in record.model_dump_json()
