"""The capacity plan: how many instances serve and how many wait warm, per zone, so a region survives losing a zone.

A pure function of explicit inputs, each with its unit in its name:

    required serving  N = max(⌈demand seqs × headroom ÷ seqs per instance⌉,
                              ⌈demand tokens/s × headroom ÷ tokens/s per instance⌉)
    serving per zone      N spread evenly over the zones (the first zones take the remainder)
    zone loss             every zone holds the same total t = serving + warm, so the largest zone is any
                          zone; after it is lost the other zones hold (zones − 1) × t ≥ N
    replay                the lost zone's in-flight sequences (demand × its share of serving) are
                          re-prefilled elsewhere: replay tokens = those sequences × context tokens per
                          sequence; they are absorbed by the promoted warm instances at their full prefill
                          rate and by the surviving serving instances at the share of their capacity the
                          demand leaves spare; replay seconds = replay tokens ÷ that rate ≤ the recovery target
    t                     the smallest total per zone for which both hold

DR tiers (reference §5, §8), each priced by the plan in loaded instances:

    hot    a standby of full size (N) kept loaded beside the serving set, and at least the zone-loss pool
    warm   the zone-loss pool above; backfill starts cold after a loss
    cold   nothing loaded beyond N; a lost zone waits for instances to load (minutes)

`previous_version_share` keeps extra warm instances on the previous weight
version (⌈share × warm⌉ per zone), so a rollback is a blue/green routing
change without 2× capacity. They do not count toward zone loss: they hold
other weights.

The capacity of one instance comes from `bench/` (concurrent sequences and
tokens/s at the latency target); demand from the gateways' reports; both
are inputs here, so the arithmetic can be checked by hand (`lifeline pool
plan` prints it).

The agent's CLI and the control plane (`GET|POST /api/v1/pool/plan`) both
run this one function and answer one record, `contract/pool_plan.py`
(`PlanInputs` in, `PlanRecord` out; the CLI's `--json` is the API's body).
The control plane may import this module and no other of `warm_pool`
(tests/unit/test_layering.py): it is pure and imports only `contract`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from contract.pool_plan import DrTier, PlanInputs, PlanRecord, StepRecord, TierCostRecord, ZonePlanRecord

_MAX_PER_ZONE = 100_000  # a plan beyond this is a wrong input, not a region


class PlanError(ValueError):
    """Inputs no plan can satisfy, or that are not numbers a plan can use; the message names the input.

    `param` is the input's path in `PlanRequest` (`instance.concurrent_sequences`), or None when no one
    input is at fault.
    """

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class InstanceCapacity:
    """What one instance sustains at the latency target (measured by bench/)."""

    concurrent_sequences: int
    decode_tokens_per_s: float
    prefill_tokens_per_s: float


@dataclass(frozen=True)
class RegionDemand:
    """The region's peak load."""

    concurrent_sequences: float
    decode_tokens_per_s: float
    context_tokens_per_sequence: float  # mean prompt + committed tokens: what a replay re-prefills


@dataclass(frozen=True)
class PlanRequest:
    region: str
    zones: tuple[str, ...]
    instance: InstanceCapacity
    demand: RegionDemand
    headroom: float = 1.2  # multiplier on demand, ≥ 1
    recovery_target_s: float = 10.0  # replay must be re-prefilled within this
    tier: DrTier = DrTier.WARM
    previous_version_share: float = 0.0  # 0 ≤ share ≤ 1


@dataclass(frozen=True)
class ZonePlan:
    zone: str
    serving: int
    warm: int
    warm_previous: int = 0

    @property
    def loaded(self) -> int:
        return self.serving + self.warm + self.warm_previous


@dataclass(frozen=True)
class Step:
    """One line of the arithmetic: what, how (with the numbers), the result and its unit."""

    name: str
    formula: str
    value: float
    unit: str


@dataclass(frozen=True)
class TierCost:
    tier: DrTier
    serving: int
    warm: int
    warm_previous: int
    survives_zone_loss: bool
    recovery: str

    @property
    def loaded_instances(self) -> int:
        return self.serving + self.warm + self.warm_previous

    @property
    def cost_ratio(self) -> float:
        """Loaded instances per serving instance: 1.0 holds nothing in reserve."""
        return self.loaded_instances / self.serving


@dataclass(frozen=True)
class CapacityPlan:
    request: PlanRequest
    required_serving: int
    zones: tuple[ZonePlan, ...]
    largest_zone: str
    survivors_after_zone_loss: int
    replay_tokens: float
    replay_seconds: float
    survives_zone_loss: bool
    tier_costs: tuple[TierCost, ...]
    steps: tuple[Step, ...] = field(default=())

    def zone(self, name: str) -> ZonePlan:
        return next(z for z in self.zones if z.zone == name)

    @property
    def serving(self) -> int:
        return sum(z.serving for z in self.zones)

    @property
    def warm(self) -> int:
        return sum(z.warm for z in self.zones)


def plan(request: PlanRequest) -> CapacityPlan:
    """The recommendation for `request.tier`, the cost of every tier, and the arithmetic behind them."""
    _validate(request)
    inst, demand = request.instance, request.demand
    steps: list[Step] = []
    by_seqs = math.ceil(demand.concurrent_sequences * request.headroom / inst.concurrent_sequences)
    steps.append(Step("serving by sequences",
                      f"⌈{demand.concurrent_sequences:g} seqs × {request.headroom:g} ÷ {inst.concurrent_sequences} seqs/instance⌉",
                      by_seqs, "instances"))
    by_tokens = math.ceil(demand.decode_tokens_per_s * request.headroom / inst.decode_tokens_per_s)
    steps.append(Step("serving by tokens",
                      f"⌈{demand.decode_tokens_per_s:g} tok/s × {request.headroom:g} ÷ {inst.decode_tokens_per_s:g} tok/s/instance⌉",
                      by_tokens, "instances"))
    required = max(by_seqs, by_tokens, 1)
    steps.append(Step("required serving N", f"max({by_seqs}, {by_tokens}, 1)", required, "instances"))

    layouts = {tier: _layout(request, required, tier) for tier in DrTier}
    chosen = layouts[request.tier]
    steps.extend(chosen.steps)
    costs = tuple(
        TierCost(tier=tier, serving=required, warm=sum(z.warm for z in lay.zones),
                 warm_previous=sum(z.warm_previous for z in lay.zones), survives_zone_loss=lay.survives,
                 recovery=_RECOVERY[tier])
        for tier, lay in layouts.items())
    return CapacityPlan(
        request=request, required_serving=required, zones=chosen.zones, largest_zone=chosen.largest_zone,
        survivors_after_zone_loss=chosen.survivors, replay_tokens=chosen.replay_tokens,
        replay_seconds=chosen.replay_seconds, survives_zone_loss=chosen.survives, tier_costs=costs,
        steps=tuple(steps))


_RECOVERY = {
    DrTier.HOT: "seconds: route to the loaded standby",
    DrTier.WARM: "seconds: promote warm, backfill cold",
    DrTier.COLD: "minutes: load weights after the loss",
}


@dataclass(frozen=True)
class _Layout:
    zones: tuple[ZonePlan, ...]
    largest_zone: str
    survivors: int
    replay_tokens: float
    replay_seconds: float
    survives: bool
    steps: tuple[Step, ...]


def _spread(total: int, count: int) -> list[int]:
    base, extra = divmod(total, count)
    return [base + (1 if i < extra else 0) for i in range(count)]


def _replay(request: PlanRequest, required: int, serving: list[int], totals: list[int], lost: int) -> tuple[float, float, float]:
    """(replay tokens, absorbing prefill rate in tokens/s, seconds) when zone index `lost` goes."""
    inst, demand = request.instance, request.demand
    lost_seqs = demand.concurrent_sequences * serving[lost] / required
    tokens = lost_seqs * demand.context_tokens_per_sequence
    spare = max(0.0, 1.0 - demand.concurrent_sequences / (required * inst.concurrent_sequences))
    warm_survivors = sum(t - s for i, (t, s) in enumerate(zip(totals, serving, strict=True)) if i != lost)
    serving_survivors = sum(s for i, s in enumerate(serving) if i != lost)
    rate = (warm_survivors + serving_survivors * spare) * inst.prefill_tokens_per_s
    seconds = tokens / rate if rate > 0 else (0.0 if tokens == 0 else math.inf)
    return tokens, rate, seconds


def _layout(request: PlanRequest, required: int, tier: DrTier) -> _Layout:
    zones = request.zones
    count = len(zones)
    serving = _spread(required, count)
    steps: list[Step] = [Step("serving per zone", f"{required} over {count} zones", max(serving), "instances (largest)")]
    if tier is DrTier.COLD:
        floor = serving
    elif tier is DrTier.HOT:
        standby = _spread(required, count)
        floor = [s + b for s, b in zip(serving, standby, strict=True)]
        steps.append(Step("hot standby", f"{required} more loaded, spread over {count} zones", required, "instances"))
    else:
        floor = serving
    total = max(floor)
    if tier is not DrTier.COLD and count > 1:
        # The smallest per-zone total with which losing any one zone leaves N and the replay fits the
        # target; both only get better as t grows, so search by doubling, then bisect.
        def fits(t: int) -> bool:
            totals = [t] * count
            return ((count - 1) * t >= required and
                    max(_replay(request, required, serving, totals, i)[2] for i in range(count)) <= request.recovery_target_s)

        high = total
        while not fits(high):
            if high >= _MAX_PER_ZONE:
                raise PlanError(f"no plan up to {_MAX_PER_ZONE} instances per zone meets recovery_target_s="
                                f"{request.recovery_target_s:g}; raise it or the prefill rate",
                                param="recovery_target_s")
            total, high = high + 1, min(high * 2, _MAX_PER_ZONE)
        while total < high:
            middle = (total + high) // 2
            total, high = (total, middle) if fits(middle) else (middle + 1, high)
        totals = [total] * count
    else:
        totals = floor
    warm = [t - s for t, s in zip(totals, serving, strict=True)]
    # The largest zone: the most instances, and among equals the worst replay.
    lost = max(range(count), key=lambda i: (totals[i], _replay(request, required, serving, totals, i)[2], -i))
    survivors = sum(t for i, t in enumerate(totals) if i != lost)
    tokens, rate, seconds = _replay(request, required, serving, totals, lost)
    survives = count > 1 and survivors >= required and seconds <= request.recovery_target_s
    share = request.previous_version_share
    previous = [math.ceil(w * share) for w in warm]
    steps += [
        Step("per-zone total t", f"smallest t with ({count} − 1) × t ≥ {required} and replay ≤ "
             f"{request.recovery_target_s:g} s" if tier is not DrTier.COLD else "serving only", max(totals), "instances"),
        Step("survivors after losing the largest zone",
             f"{sum(totals)} − {totals[lost]} ({zones[lost]})", survivors, "instances"),
        Step("replay tokens",
             f"{request.demand.concurrent_sequences:g} seqs × {serving[lost]}/{required} × "
             f"{request.demand.context_tokens_per_sequence:g} tok/seq", round(tokens, 1), "tokens"),
        Step("replay prefill rate", "(surviving warm + surviving serving × spare share) × "
             f"{request.instance.prefill_tokens_per_s:g} tok/s", round(rate, 1), "tokens/s"),
        Step("replay time", f"{tokens:.0f} ÷ {rate:.0f}" if rate else "no capacity left", round(seconds, 3), "s"),
    ]
    if share:
        steps.append(Step("warm on the previous version", f"⌈warm per zone × {share:g}⌉ (beyond zone loss)",
                          sum(previous), "instances"))
    return _Layout(
        zones=tuple(ZonePlan(z, s, w, p) for z, s, w, p in zip(zones, serving, warm, previous, strict=True)),
        largest_zone=zones[lost], survivors=survivors, replay_tokens=tokens, replay_seconds=seconds,
        survives=survives, steps=tuple(steps))


def _validate(request: PlanRequest) -> None:
    inst, demand = request.instance, request.demand
    if not request.zones:
        raise PlanError("zones: a region needs at least one zone", param="zones")
    if len(set(request.zones)) != len(request.zones):
        raise PlanError(f"zones: each zone once, got {list(request.zones)}", param="zones")
    if request.tier is not DrTier.COLD and len(request.zones) < 2:
        raise PlanError(f"zones: a {request.tier} plan survives the loss of a zone, so it needs two or more "
                        "zones in the region (a one-zone region fails over to another region)", param="zones")
    checks = [
        ("instance.concurrent_sequences", inst.concurrent_sequences, False),
        ("instance.decode_tokens_per_s", inst.decode_tokens_per_s, False),
        ("instance.prefill_tokens_per_s", inst.prefill_tokens_per_s, False),
        ("demand.concurrent_sequences", demand.concurrent_sequences, True),
        ("demand.decode_tokens_per_s", demand.decode_tokens_per_s, True),
        ("demand.context_tokens_per_sequence", demand.context_tokens_per_sequence, True),
        ("recovery_target_s", request.recovery_target_s, False),
    ]
    for name, value, zero_ok in checks:
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
            raise PlanError(f"{name} must be a finite number {'≥' if zero_ok else '>'} 0, got {value!r}", param=name)
    if not (math.isfinite(request.headroom) and request.headroom >= 1):
        raise PlanError(f"headroom must be ≥ 1 (a multiplier on demand), got {request.headroom!r}", param="headroom")
    if not 0 <= request.previous_version_share <= 1:
        raise PlanError(f"previous_version_share must be within [0, 1], got {request.previous_version_share!r}",
                        param="previous_version_share")


# -- the record: what `lifeline pool plan --json` prints and `/api/v1/pool/plan` answers (contract/pool_plan.py) --

# PlanRequest's input paths (PlanError.param) → PlanInputs' names
INPUT_NAMES: dict[str, str] = {
    "instance.concurrent_sequences": "instance_seqs", "instance.decode_tokens_per_s": "instance_tokens_per_s",
    "instance.prefill_tokens_per_s": "instance_prefill_tokens_per_s", "demand.concurrent_sequences": "demand_seqs",
    "demand.decode_tokens_per_s": "demand_tokens_per_s", "demand.context_tokens_per_sequence": "context_tokens",
}


def request_of(inputs: PlanInputs) -> PlanRequest:
    return PlanRequest(
        region=inputs.region, zones=tuple(inputs.zones),
        instance=InstanceCapacity(inputs.instance_seqs, inputs.instance_tokens_per_s,
                                  inputs.instance_prefill_tokens_per_s),
        demand=RegionDemand(inputs.demand_seqs, inputs.demand_tokens_per_s, inputs.context_tokens),
        headroom=inputs.headroom, recovery_target_s=inputs.recovery_target_s, tier=inputs.tier,
        previous_version_share=inputs.previous_version_share)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def record_of(result: CapacityPlan) -> PlanRecord:
    req = result.request
    return PlanRecord(
        region=req.region, tier=req.tier, required_serving=result.required_serving,
        zones=[ZonePlanRecord(zone=z.zone, serving=z.serving, warm=z.warm, warm_previous=z.warm_previous)
               for z in result.zones],
        largest_zone=result.largest_zone, survivors_after_zone_loss=result.survivors_after_zone_loss,
        replay_tokens=result.replay_tokens, replay_seconds=_finite(result.replay_seconds),
        survives_zone_loss=result.survives_zone_loss,
        tiers=[TierCostRecord(tier=c.tier, serving=c.serving, warm=c.warm, warm_previous=c.warm_previous,
                              loaded_instances=c.loaded_instances, cost_ratio=round(c.cost_ratio, 3),
                              survives_zone_loss=c.survives_zone_loss, recovery=c.recovery)
               for c in result.tier_costs],
        arithmetic=[StepRecord(name=s.name, formula=s.formula, value=_finite(s.value), unit=s.unit)
                    for s in result.steps])


def plan_inputs(inputs: PlanInputs) -> CapacityPlan:
    """`plan()` on the record's inputs; a PlanError names the input as `PlanInputs` (and the CLI's flags) do."""
    try:
        return plan(request_of(inputs))
    except PlanError as exc:
        name = INPUT_NAMES.get(exc.param or "", exc.param)
        message = str(exc).replace(exc.param, name, 1) if exc.param and name else str(exc)
        raise PlanError(message, param=name) from None


def plan_record(inputs: PlanInputs) -> PlanRecord:
    """The plan of `inputs` as the record the API answers and `lifeline pool plan --json` prints."""
    return record_of(plan_inputs(inputs))
