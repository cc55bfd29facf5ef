"""Mesh routes: how a model's traffic is split across its versions (and zones), per header cohort.

The mesh tier of a cutover, in Lifeline's own gateways. The control plane
publishes them in the routing snapshot (`RoutingSnapshot.mesh_routes`);
a gateway applies them when a client names the model itself (`tiny`), not
when it pins an alias (`tiny:canary`) or a version (`tiny-seed1`):

    route     model, region (None: every region), cohort (None: the default
              route), destinations [(version, zone | None, weight)]
    cohort    the request's `X-Lifeline-Cohort` header (prod / canary /
              shadow, or any name); a request whose cohort has no route
              of its own takes the default route
    weights   relative (99/1 is a 1 % canary); the version is picked in
              proportion to its destinations' summed weight, by the client
              key's hash when there is one (a client stays on one version)
    zones     a destination with a zone and weight 0 takes that version's
              instances in that zone out of routing (a zone's mesh share
              to zero); non-zero zone weights are not traffic shares

"shadow" is a cohort name like any other: requests that carry it are
routed to the shadow route's versions; nothing is mirrored.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

COHORT_HEADER = "x-lifeline-cohort"


class MeshDestination(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    version: str
    zone: str | None = Field(None, description="None: the version in every zone")
    weight: int = Field(ge=0, le=1_000_000)


class MeshRoute(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    model: str
    region: str | None = Field(None, description="None: every region")
    cohort: str | None = Field(None, description="X-Lifeline-Cohort value; None: the default route")
    destinations: tuple[MeshDestination, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _destinations_unique(self) -> MeshRoute:
        keys = [(d.version, d.zone) for d in self.destinations]
        if len(set(keys)) != len(keys):
            raise ValueError(f"route {self.model}/{self.cohort or 'default'} names a (version, zone) twice")
        return self

    def version_weights(self) -> dict[str, int]:
        """Each version's summed weight over its destinations."""
        weights: dict[str, int] = {}
        for d in self.destinations:
            weights[d.version] = weights.get(d.version, 0) + d.weight
        return weights
