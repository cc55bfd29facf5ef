"""Request and response bodies of /api/v1/mesh-routes."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contract.mesh import MeshDestination, MeshRoute
from controlplane.types import Name, Reason

COHORT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class MeshRouteSpec(BaseModel):
    """`PUT /api/v1/mesh-routes`: set one route (created if new)."""

    model_config = ConfigDict(extra="forbid")

    model: Name
    region: Name | None = Field(None, description="None: every region")
    cohort: str | None = Field(None, pattern=COHORT_PATTERN, description="X-Lifeline-Cohort; None: default route")
    destinations: list[MeshDestination] = Field(min_length=1, max_length=64)
    reason: Reason
    expected_revision: int | None = Field(None, ge=0, le=2**31 - 1, description="compare-and-set; 0: must be new")

    @model_validator(mode="after")
    def _some_weight(self) -> MeshRouteSpec:
        MeshRoute(model=self.model, region=self.region, cohort=self.cohort, destinations=tuple(self.destinations))
        if not any(d.weight for d in self.destinations):
            raise ValueError("a mesh route needs some destination with weight > 0")
        return self


class MeshRouteRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    model: str
    region: str | None
    cohort: str | None
    destinations: list[MeshDestination]
    revision: int
    reason: str
    updated_by: str
