from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from contract.canary import CanaryRecord
from controlplane.types import Name, Reason, Text
from weight_catalog.models import Severity


class ShardRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    path: str
    size: int
    sha256: str


class IssueRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    severity: Severity
    title: str
    description: str
    opened_by: str
    opened_at: datetime
    resolved_by: str | None
    resolved_at: datetime | None
    resolution: str | None


class VersionSummary(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    model: str
    version: str
    location: str
    total_bytes: int
    fingerprint: str
    registered_by: str
    registered_at: datetime
    last_verified_at: datetime | None = None
    last_verify_healthy: bool | None = None
    last_verify_location: str | None = None


class VersionRead(VersionSummary):
    fingerprint_parts: dict[str, str]
    canary: CanaryRecord | None = Field(None, description="the recorded canary agents check output against")
    canary_recorded_at: datetime | None = None
    canary_recorded_by: str | None = None
    shards: list[ShardRead]
    issues: list[IssueRead]


class RegisterVersion(BaseModel):
    version: Name
    location: str = Field(min_length=1, max_length=1000, pattern=r"^[^\x00]+$")


class IssueCreate(BaseModel):
    severity: Severity
    title: str = Field(min_length=1, max_length=400, pattern=r"^[^\x00]+$")
    description: Text = ""


class IssueResolve(BaseModel):
    resolution: Text = ""


class PromoteRequest(BaseModel):
    version: Name
    reason: Text = ""
    force: bool = False
    expected_revision: int | None = Field(default=None, ge=0, le=2**31 - 1)


class RollbackRequest(BaseModel):
    reason: Reason
    force: bool = False
    expected_revision: int | None = Field(default=None, ge=0, le=2**31 - 1)


class CanaryFailure(BaseModel):
    """An agent's report: the version an alias points at failed its canary (`POST …/aliases/{alias}/canary-failures`)."""

    model_config = ConfigDict(extra="forbid")

    version: Name
    expected_revision: int = Field(ge=0, le=2**31 - 1, description="the alias revision the agent's snapshot showed")
    instances: list[Name] = Field(min_length=1, max_length=64, description="the instances whose canary failed")
    reason: Reason = Field(description="the canary's verdict, e.g. `canary: token 0 is 7, recorded 3`")


class VerifyRequest(BaseModel):
    location: str | None = Field(default=None, min_length=1, max_length=1000, pattern=r"^[^\x00]+$")


class AliasRead(BaseModel):
    model: str
    name: str
    version: str
    revision: int
    updated_at: datetime


class AliasMoveRead(BaseModel):
    id: int
    action: str
    from_version: str | None
    to_version: str
    revision: int
    forced: bool
    actor: str
    reason: str
    moved_at: datetime
    event_id: int | None


class ShardMismatch(BaseModel):
    path: str
    expected_sha256: str
    actual_sha256: str | None
    expected_size: int
    actual_size: int


class VerifyReport(BaseModel):
    model: str
    version: str
    location: str
    healthy: bool
    checked: int
    mismatched: list[ShardMismatch]
    missing: list[str]
    unexpected: list[str]
    fingerprint_drift: list[str] = Field(
        default_factory=list, description="semantic parts the files now there no longer match (unhealthy)"
    )
