from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from contract.routing_tier import RoutingTier
from controlplane.topology.models import ClusterState
from controlplane.types import Name, Reason, Text


class RegionCreate(BaseModel):
    name: Name
    description: Text = ""


class RegionRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    name: str
    description: str
    created_at: datetime
    zones: list[str] = []


class ZoneCreate(BaseModel):
    name: Name


class ZoneRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    region: str
    name: str
    created_at: datetime


class ClusterCreate(BaseModel):
    name: Name
    region: Name
    zone: Name | None = None
    model: Name
    endpoint: str = Field(default="", max_length=1000, pattern=r"^[^\x00]*$")
    weight: int = Field(default=100, ge=0, le=10_000)


class ClusterUpdate(BaseModel):
    weight: int | None = Field(default=None, ge=0, le=10_000)
    state: ClusterState | None = None
    reason: Reason
    routing_tier: RoutingTier = RoutingTier.L7
    expected_revision: int | None = Field(default=None, ge=0, le=2**31 - 1)


class ClusterRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    name: str
    region: str
    zone: str | None
    model: str
    endpoint: str
    weight: int
    state: ClusterState
    revision: int
    updated_at: datetime


class EjectionCreate(BaseModel):
    instance_id: Name
    generation: int = Field(ge=0, le=2**31 - 1)
    reason: Reason


class EjectionRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    region: str
    instance_id: str
    generation: int
    reason: str
    actor: str
    created_at: datetime


class InstanceRead(BaseModel):
    instance_id: str
    generation: int
    url: str
    version: str
    zone: str
    lease_expires_at: datetime
    live: bool
    ejected: bool
