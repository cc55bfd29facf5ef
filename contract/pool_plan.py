"""The capacity plan's records: what `lifeline pool plan --json` prints and `/api/v1/pool/plan` answers.

`PlanInputs` in, `PlanRecord` out; the CLI's `--json` is the API's body.
The plan itself — the arithmetic that turns one into the other — is
`warm_pool/capacity.py`; the regional agent's CLI and the control plane
both run it and both import these shapes, so the record is defined once.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class DrTier(StrEnum):
    HOT = "hot"
    WARM = "warm"
    COLD = "cold"


def _zone_list(value: Any) -> Any:
    """`a,b,c` (a flag, a query parameter, repeated or not) or a JSON list: the same zones."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list | tuple):
        return [z.strip() if isinstance(z, str) else z
                for item in value for z in (item.split(",") if isinstance(item, str) else [item])
                if not isinstance(z, str) or z.strip()]
    return value


ZoneName = Annotated[str, Field(min_length=1, max_length=128, pattern=NAME_PATTERN)]


class PlanInputs(BaseModel):
    """A plan's inputs under the CLI's flag names (`--demand-seqs` is `demand_seqs`), each with its unit.

    Only shapes are checked here; whether the numbers make a plan is `warm_pool.capacity.plan()`'s to say
    (`PlanError` names the input), so the CLI and the API refuse the same inputs with the same message.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    region: str = Field(min_length=1, max_length=128, pattern=NAME_PATTERN)
    zones: Annotated[list[ZoneName], BeforeValidator(_zone_list)] = Field(
        min_length=1, max_length=64, description="the region's zones: a JSON list, or `a,b,c`")
    demand_seqs: float = Field(description="peak concurrent sequences in the region")
    demand_tokens_per_s: float = Field(description="peak output tokens/s in the region")
    context_tokens: float = Field(description="mean prompt + committed tokens per in-flight sequence")
    instance_seqs: int = Field(ge=-(2**31), le=2**31, description="concurrent sequences one instance serves at "
                               "the latency target")
    instance_tokens_per_s: float = Field(description="output tokens/s one instance sustains")
    instance_prefill_tokens_per_s: float = Field(description="prompt tokens/s one instance prefills")
    headroom: float = Field(1.2, description="multiplier on demand, ≥ 1")
    recovery_target_s: float = Field(10.0, description="seconds the lost zone's replay may take")
    tier: DrTier = DrTier.WARM
    previous_version_share: float = Field(0.0, description="extra warm on the previous version, share of warm")


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ZonePlanRecord(_Out):
    zone: str
    serving: int
    warm: int
    warm_previous: int = Field(description="warm on the previous version, beyond zone loss")


class TierCostRecord(_Out):
    tier: DrTier
    serving: int
    warm: int
    warm_previous: int
    loaded_instances: int
    cost_ratio: float = Field(description="loaded instances per serving instance")
    survives_zone_loss: bool
    recovery: str


class StepRecord(_Out):
    name: str
    formula: str = Field(description="the arithmetic, with the numbers in it")
    value: float | None = Field(description="None: infinite (no capacity left)")
    unit: str


class PlanRecord(_Out):
    """The plan as a record: per zone serving / warm / warm on the previous version, every tier's cost and
    every line of the arithmetic."""

    region: str
    tier: DrTier
    required_serving: int
    zones: list[ZonePlanRecord]
    largest_zone: str
    survivors_after_zone_loss: int
    replay_tokens: float
    replay_seconds: float | None = Field(description="None: nothing is left to re-prefill the lost zone's replay")
    survives_zone_loss: bool
    tiers: list[TierCostRecord]
    arithmetic: list[StepRecord]
