"""The probe budget on virtual time: 30 instances, ten minutes, every window counted."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from common.clock import ManualClock
from contract.lease import Registration
from warm_pool.budget import ProbeBudget

INSTANCES = [f"engine-{i:02d}" for i in range(30)]
TICK = 0.1


def run(budget: ProbeBudget, clock: ManualClock, seconds: float, *, served: set[str] = frozenset()) -> list[tuple[float, str]]:
    sent = []
    for _ in range(int(seconds / TICK)):
        clock.advance(TICK)
        for instance_id in served:
            budget.note_served(instance_id, clock.now())
        sent += [(clock.now(), i) for i in budget.due(INSTANCES)]
    return sent


def test_budget_holds_with_30_instances_in_every_window() -> None:
    clock = ManualClock()
    budget = ProbeBudget(clock, per_instance_per_s=0.1, jitter=0.2, rng=random.Random(7))
    sent = run(budget, clock, 600)
    rate = 30 * 0.1
    times = [t for t, _ in sent]
    for window in (1.0, 10.0, 60.0):
        worst = max(sum(1 for t in times if start <= t < start + window) for start in times)
        assert worst <= rate * (window + budget.burst_s), window
    assert len(sent) / 600 <= rate
    # and it spends what it may: each instance about once per 10 s
    per_instance = Counter(i for _, i in sent)
    assert set(per_instance) == set(INSTANCES)
    assert min(per_instance.values()) >= 600 / (10 * 1.2) - 2


def test_no_instance_waits_more_than_two_intervals() -> None:
    clock = ManualClock()
    budget = ProbeBudget(clock, rng=random.Random(3))
    sent = run(budget, clock, 300)
    for instance_id in INSTANCES:
        times = [0.0 + clock.start] + [t for t, i in sent if i == instance_id]
        assert max(b - a for a, b in zip(times, times[1:])) <= 2 * budget.interval_s


def test_instances_serving_real_traffic_count_as_probed_but_are_still_canaried_within_the_cap() -> None:
    """Served traffic saves canaries, yet a busy instance is canaried at least every two intervals.

    A corrupted engine serving steady traffic answers 200 every time: with
    unbounded credit it was never canaried again, and served wrong answers
    for as long as its traffic lasted.
    """
    clock = ManualClock()
    budget = ProbeBudget(clock, rng=random.Random(5))
    busy = set(INSTANCES[:20])
    sent = run(budget, clock, 120, served=busy)
    per_instance = Counter(i for _, i in sent)
    assert budget.skipped_as_served > 0
    assert max(per_instance[i] for i in busy) < min(per_instance[i] for i in INSTANCES[20:])  # credit saves some
    for instance_id in busy:
        times = [clock.start] + [t for t, i in sent if i == instance_id]
        gaps = [b - a for a, b in zip(times, times[1:])] + [clock.now() - times[-1]]
        bound = budget.served_credit_intervals * budget.interval_s * (1 + budget.jitter) + 1.0  # + the bucket's wait
        assert max(gaps) <= bound, instance_id


def test_served_credit_below_one_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="served_credit_intervals"):
        ProbeBudget(ManualClock(), served_credit_intervals=0.5)


def test_a_tighter_budget_is_configurable() -> None:
    clock = ManualClock()
    budget = ProbeBudget(clock, per_instance_per_s=0.02, rng=random.Random(1))
    sent = run(budget, clock, 500)
    assert len(sent) <= 30 * 0.02 * (500 + budget.burst_s)


def test_budget_refuses_a_nonsense_rate() -> None:
    with pytest.raises(ValueError, match="per_instance_per_s"):
        ProbeBudget(ManualClock(), per_instance_per_s=0)


async def test_the_agent_keeps_the_budget_with_30_engines_and_shows_its_probe_rate() -> None:
    """The whole agent (not the bucket alone): 30 engines for 75 s; every inference probe reaches an
    engine, and the metrics say the rate the agent spends and the rate it may."""
    from tests.unit.warm_pool.test_pool_agent import Fleet, ScriptedEngine, make_agent, settle

    clock, fleet = ManualClock(), Fleet()
    agent, registry, _ = make_agent(fleet, clock)
    for instance_id in INSTANCES:  # engines that renew their own leases: no admission canary, only the budget's
        fleet.engines[instance_id] = ScriptedEngine(instance_id)
        await registry.register(Registration(instance_id, f"http://{instance_id}", "v1", "z1", "r1"))
    seconds, step = 75, 1.0
    sent: list[tuple[float, int]] = []
    for _ in range(int(seconds / step)):
        for instance_id in INSTANCES:  # they renew their own leases
            await registry.renew(instance_id, registry.leases[instance_id].generation)
        await settle(agent, clock, step=step)
        sent.append((clock.now(), sum(e.canaries for e in fleet.engines.values())))

    metric = agent.metrics.registry.get_sample_value
    total = sum(e.canaries for e in fleet.engines.values())
    assert sum(metric("lifeline_agent_inference_probes_total", {"verdict": v}) or 0 for v in ("ok", "wrong_output",
               "timeout", "error", "overloaded")) == total
    assert metric("lifeline_agent_inference_probe_budget_per_second", {}) == pytest.approx(30 * 0.1)
    assert total <= 30 * 0.1 * (seconds + 1)
    for (t0, n0), (t1, n1) in zip(sent, sent[10:]):  # every 10 s window
        assert n1 - n0 <= 30 * 0.1 * (t1 - t0 + 1)
    rate = metric("lifeline_agent_inference_probe_rate_per_second", {})
    assert rate is not None and 30 * 0.1 * 0.7 <= rate <= 30 * 0.1 * (60 + 1) / 60
    assert all(e.canaries >= 1 for e in fleet.engines.values())


@pytest.mark.parametrize("count", [1, 3, 9])
def test_a_small_pool_still_gets_canaries_and_the_bound_holds_with_the_one_canary_floor(count: int) -> None:
    """Below 10 instances a second's worth of budget is under one canary; the bucket holds one instead."""
    clock = ManualClock()
    budget = ProbeBudget(clock, per_instance_per_s=0.1, jitter=0.2, rng=random.Random(count))
    instances = INSTANCES[:count]
    sent = []
    for _ in range(int(600 / TICK)):
        clock.advance(TICK)
        sent += [clock.now() for _ in budget.due(instances)]
    rate = count * 0.1
    for window in (1.0, 10.0, 60.0):
        worst = max(sum(1 for t in sent if start <= t < start + window) for start in sent)
        assert worst <= rate * window + max(rate * budget.burst_s, 1.0), window
    assert len(sent) >= 600 * rate * 0.8  # and it spends about what it may
