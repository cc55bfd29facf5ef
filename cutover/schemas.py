"""Request and response bodies of /api/v1/cutovers, /api/v1/cutover-gate and /api/v1/zonal-shifts."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contract.routing_tier import RoutingTier
from controlplane.types import Name, Reason
from cutover.drivers.step import StepState
from cutover.models import CutoverMode
from cutover.scope import ScopeKind, TargetState
from cutover.states import CutoverState, StepStatus

IdempotencyKey = Field(min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$")


class ScopeSpec(BaseModel):
    kind: ScopeKind
    region: Name
    name: Name | None = Field(default=None, description="the zone or instance id; omitted for a region")

    @model_validator(mode="after")
    def _name_matches_kind(self) -> ScopeSpec:
        if self.kind == ScopeKind.REGION:
            if self.name not in (None, self.region):
                raise ValueError("a region scope has no separate name")
            self.name = self.region
        elif self.name is None:
            raise ValueError(f"a {self.kind.value} scope needs a name")
        return self


class CutoverPlanRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scope: ScopeSpec
    tier: RoutingTier
    target_state: TargetState = TargetState.OUT
    reason: Reason
    mode: CutoverMode = CutoverMode.MANUAL
    evidence: dict[str, Any] | None = Field(default=None, description="automatic mode: what triggered it")
    generation: int | None = Field(default=None, ge=0, le=2**31 - 1,
                                   description="instance scope at l7: the endpoint generation to eject")
    step_timeout_s: float | None = Field(default=None, gt=0, le=3600)

    @model_validator(mode="after")
    def _automatic_names_evidence(self) -> CutoverPlanRequest:
        if self.mode == CutoverMode.AUTOMATIC and not self.evidence:
            raise ValueError("an automatic cutover must name the evidence that triggered it")
        return self


class ExecuteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    idempotency_key: str = IdempotencyKey
    break_glass: bool = False
    break_glass_reason: Reason | None = None


class RollbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Reason


class StepRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    position: int
    tier: RoutingTier
    driver: str
    driver_target: str
    expected_before: StepState
    expected_after: StepState
    actual_before: StepState | None
    timeout_s: float
    status: StepStatus
    outcome: str | None
    evidence: dict[str, Any] | None
    started_at: datetime | None
    ended_at: datetime | None
    revert_evidence: dict[str, Any] | None
    revert_started_at: datetime | None
    revert_ended_at: datetime | None


class CutoverRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    scope_kind: ScopeKind
    region: str
    scope_name: str
    scope: str
    tier: RoutingTier
    target_state: TargetState
    reason: str
    mode: CutoverMode
    evidence: dict[str, Any] | None
    generation: int | None = Field(default=None, description="an instance scope: the endpoint generation it acts on")
    planned_by: str
    executed_by: str | None
    idempotency_key: str | None
    break_glass: bool
    break_glass_reason: str | None
    state: CutoverState
    revision: int
    claimed_until: datetime | None
    failure: str | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    steps: list[StepRead]


class PlanRead(CutoverRead):
    safety: list[dict[str, Any]] = Field(
        default_factory=list, description="rules that would refuse execution now (informational: re-checked on execute)"
    )
    recorded_only: list[RoutingTier] = Field(
        default_factory=list, description="tiers with no driver configured: their steps are recorded, nothing is changed")


class GateRead(BaseModel):
    stopped: bool
    reason: str
    actor: str | None
    revision: int
    changed_at: datetime | None


class GateUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stopped: bool
    reason: Reason
    expected_revision: int | None = Field(default=None, ge=0, le=2**31 - 1)


class ZonalShiftStart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    region: Name
    zone: Name
    expires_in: timedelta = Field(description="mandatory; at most 72 hours (ISO 8601 duration or seconds)")
    reason: Reason


class ZonalShiftRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    region: str
    zone: str
    reason: str
    actor: str
    cutover_id: int
    started_at: datetime
    expires_at: datetime
    ended_at: datetime | None
    end_reason: str | None
    ended_by: str | None
    active: bool = False


class EscalationRequest(BaseModel):
    """`POST /api/v1/cutover-escalations`: a detector reports a fault; the ladder decides and acts."""

    model_config = ConfigDict(extra="forbid")

    fault_id: str = Field(min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$",
                          description="ties the attempts for one fault together; the same id resumes its ladder")
    scope: ScopeSpec
    zone: Name | None = Field(default=None, description="an instance fault: the instance's zone, to escalate to")
    generation: int | None = Field(default=None, ge=0, le=2**31 - 1,
                                   description="an instance fault: the generation l7 ejects through the snapshot")
    evidence: dict[str, Any] = Field(min_length=1, description="what the detector saw; named by every action")


class DecisionRead(BaseModel):
    action: str
    reason: str
    rung: int | None
    tiers: list[RoutingTier]
    scope: str | None
    evidence: dict[str, Any]


class EscalationRead(BaseModel):
    decisions: list[DecisionRead]
    cutovers: list[CutoverRead]
