"""The mesh tier in Lifeline's own gateways: mesh routes, and the cutover driver that moves them.

A mesh route (`contract.mesh.MeshRoute`, stored as `MeshRouteRecord`)
splits a model's requests across its versions — and, when destinations
name zones, takes a zone's share to zero — for one header cohort in one
region or in all. Operators set and delete them (`PUT` / `DELETE
/api/v1/mesh-routes`, `lifeline cutover mesh-route set|delete`: a 99/1
canary, a shadow cohort); every write bumps the routing version and writes
one `mesh.route` event with `routing_tier=mesh`, so gateways get it in the
next snapshot.

`SnapshotMeshDriver` is the mesh tier's built-in driver for cutovers of a
zone: each route that names the zone is a step; "out" takes the zone's
destinations to 0 and gives their share to the others in proportion
(`cutover.tiers.mesh_weights`, the same rule as the Istio driver), "in"
gives each an even share back; rollback restores the recorded weights.
It verifies as the l7 tier does (`cutover.l7`): the route as the snapshot
shows it, then every fresh gateway of the region on that snapshot
version or a newer one.

Versions a route names must be ones an alias of the model points at: the
snapshot describes only aliased versions, and a gateway can load no other.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy import select
from sqlalchemy.orm import Session

from common.clock import Clock
from contract.mesh import MeshDestination, MeshRoute
from contract.snapshot import RoutingSnapshot
from controlplane.db import session_scope
from controlplane.event import service as event_service
from controlplane.event.models import RoutingTier
from controlplane.types import Name, Reason
from cutover.errors import MeshRouteConflict, MeshRouteInUse, MeshUnknownVersion
from cutover.l7 import ACTOR, SnapshotL7Driver
from cutover.models import ANY, CutoverTier, MeshRouteRecord, ScopeKind, TargetState
from cutover.tiers import Scope, mesh_weights

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


def _read(record: MeshRouteRecord) -> MeshRouteRead:
    return MeshRouteRead(model=record.model, region=None if record.region == ANY else record.region,
                         cohort=None if record.cohort == ANY else record.cohort,
                         destinations=[MeshDestination.model_validate(d) for d in record.destinations],
                         revision=record.revision, reason=record.reason, updated_by=record.updated_by)


def _find(session: Session, *, model: str, region: str | None, cohort: str | None) -> MeshRouteRecord | None:
    return session.scalar(select(MeshRouteRecord).where(
        MeshRouteRecord.model == model, MeshRouteRecord.region == (region or ANY),
        MeshRouteRecord.cohort == (cohort or ANY)))


def list_routes(session: Session) -> list[MeshRouteRead]:
    rows = session.scalars(select(MeshRouteRecord).order_by(
        MeshRouteRecord.model, MeshRouteRecord.region, MeshRouteRecord.cohort)).all()
    return [_read(r) for r in rows]


def snapshot_routes(session: Session) -> list[MeshRoute]:
    """What `RoutingSnapshot.mesh_routes` carries."""
    return [MeshRoute(model=r.model, region=r.region, cohort=r.cohort, destinations=tuple(r.destinations))
            for r in list_routes(session)]


def _scope_of(model: str, region: str | None) -> str:
    return f"region:{region}" if region else "global"


def put_route(session: Session, spec: MeshRouteSpec, *, actor: str, clock: Clock,
              check_versions: bool = True) -> MeshRouteRead:
    """Create or replace one route; bumps the routing version and writes one `mesh.route` event. Never commits.

    `check_versions=False` is for a cutover re-weighting a route's existing destinations: it must be able
    to take a zone to zero even if an alias has moved off one of their versions since the route was set.
    """
    from controlplane.routing_version import service as routing_version
    from weight_catalog import repository as catalog

    aliased = {v.version for a, v in catalog.aliases_with_versions(session) if a.model == spec.model}
    unknown = sorted({d.version for d in spec.destinations} - aliased) if check_versions else []
    if unknown:
        raise MeshUnknownVersion(f"model {spec.model!r} has no aliased version {unknown} (aliased: {sorted(aliased)});"
                                 " the snapshot describes only versions an alias points at")
    record = _find(session, model=spec.model, region=spec.region, cohort=spec.cohort)
    held = record.revision if record is not None else 0
    if spec.expected_revision is not None and spec.expected_revision != held:
        raise MeshRouteConflict(f"mesh route {spec.model}/{spec.region or ANY}/{spec.cohort or ANY} is at revision "
                                f"{held}, not {spec.expected_revision}")
    before = _read(record).model_dump(mode="json") if record is not None else None
    destinations = [d.model_dump(mode="json") for d in spec.destinations]
    now = clock.utcnow()
    if record is None:
        record = MeshRouteRecord(model=spec.model, region=spec.region or ANY, cohort=spec.cohort or ANY,
                                 destinations=destinations, revision=1, reason=spec.reason, updated_by=actor,
                                 updated_at=now)
        session.add(record)
    else:
        record.destinations, record.revision = destinations, record.revision + 1
        record.reason, record.updated_by, record.updated_at = spec.reason, actor, now
    session.flush()
    routing_version.bump(session, clock=clock)
    after = _read(record)
    event_service.record(session, kind="mesh.route", actor=actor, reason=spec.reason,
                         scope=_scope_of(spec.model, spec.region), clock=clock, routing_tier=RoutingTier.MESH,
                         before=before, after=after.model_dump(mode="json"))
    return after


def _holders(session: Session, record: MeshRouteRecord) -> list[int]:
    """Cutovers with a mesh step on this route that are running, completed or failed: their rollback restores it."""
    from cutover.models import Cutover, CutoverStep
    from cutover.states import ACTIVE_STATES, CutoverState

    held = [s.value for s in ACTIVE_STATES | {CutoverState.COMPLETED, CutoverState.FAILED}]
    steps = session.scalars(select(CutoverStep).join(Cutover, Cutover.id == CutoverStep.cutover_id).where(
        CutoverStep.tier == CutoverTier.MESH.value, Cutover.state.in_(held))).all()
    return sorted({step.cutover_id for step in steps
                   if ((step.expected_before or {}).get("target") or {}).get("kind") == "mesh_route"
                   and (step.expected_before["target"].get("model"), step.expected_before["target"].get("route_region"),
                        step.expected_before["target"].get("cohort")) == (record.model, record.region, record.cohort)})


def delete_route(session: Session, *, model: str, region: str | None, cohort: str | None, reason: str, actor: str,
                 clock: Clock, expected_revision: int | None = None) -> MeshRouteRead:
    """Remove one route; bumps the routing version and writes one `mesh.route` event (after: none). Never commits.

    Refused while a cutover that changed it can still be rolled back (`mesh_route_in_use`): its rollback
    restores the route's recorded weights and would find nothing to restore.
    """
    from controlplane.errors import NotFound
    from controlplane.routing_version import service as routing_version

    name = f"{model}/{region or ANY}/{cohort or ANY}"
    record = _find(session, model=model, region=region, cohort=cohort)
    if record is None:
        raise NotFound(f"no mesh route {name}")
    if expected_revision is not None and expected_revision != record.revision:
        raise MeshRouteConflict(f"mesh route {name} is at revision {record.revision}, not {expected_revision}")
    holders = _holders(session, record)
    if holders:
        raise MeshRouteInUse(f"mesh route {name} was changed by cutover(s) {', '.join(f'#{i}' for i in holders)}, "
                             "which would restore it on rollback; roll them back first")
    before = _read(record)
    session.delete(record)
    session.flush()
    routing_version.bump(session, clock=clock)
    event_service.record(session, kind="mesh.route", actor=actor, reason=reason, scope=_scope_of(model, region),
                         clock=clock, routing_tier=RoutingTier.MESH, before=before.model_dump(mode="json"),
                         after=None)
    return before


def _key(destination: dict[str, Any]) -> str:
    return f"{destination['version']}@{destination.get('zone') or ANY}"


class SnapshotMeshDriver(SnapshotL7Driver):
    """The mesh tier through the snapshot: a zone's destinations of each mesh route (see the module docstring)."""

    tier = CutoverTier.MESH
    name = "snapshot"

    def targets(self, scope: Scope, *, generation: int | None = None) -> list[dict[str, Any]]:
        if scope.kind != ScopeKind.ZONE:
            return []  # an instance is l7's; a whole region is dns's (a route cannot send nowhere)
        with session_scope(self.read_factory) as session:
            rows = session.scalars(select(MeshRouteRecord).where(MeshRouteRecord.region.in_([scope.region, ANY]))
                                   .order_by(MeshRouteRecord.model, MeshRouteRecord.region,
                                             MeshRouteRecord.cohort)).all()
            return [{"kind": "mesh_route", "model": r.model, "route_region": r.region, "cohort": r.cohort,
                     "zone": scope.name, "region": scope.region}
                    for r in rows if any(d.get("zone") == scope.name for d in r.destinations)]

    def desired(self, before: dict[str, Any], target_state: TargetState) -> dict[str, Any]:
        zone = before["target"]["zone"]
        destinations = before["destinations"]
        weights = mesh_weights({_key(d): d["weight"] for d in destinations},
                               [_key(d) for d in destinations if d.get("zone") == zone], target_state)
        return {**before, "destinations": [{**d, "weight": weights[_key(d)]} for d in destinations]}

    def _read(self, session: Session, target: dict[str, Any]) -> dict[str, Any]:
        record = session.scalar(select(MeshRouteRecord).where(
            MeshRouteRecord.model == target["model"], MeshRouteRecord.region == target["route_region"],
            MeshRouteRecord.cohort == target["cohort"]))
        if record is None:
            return {"target": target, "destinations": []}
        return {"target": target, "destinations": [MeshDestination.model_validate(d).model_dump(mode="json")
                                                   for d in record.destinations]}

    def apply(self, desired: dict[str, Any]) -> None:
        target = desired["target"]
        with session_scope(self.factory) as session:
            current = self._read(session, target)
            if current == desired:
                return  # idempotent: a resumed step finds its change already made
            if not current["destinations"]:
                raise MeshRouteConflict(f"mesh route {target['model']}/{target['route_region']}/{target['cohort']} "
                                        "no longer exists")
            region = None if target["route_region"] == ANY else target["route_region"]
            put_route(session, MeshRouteSpec(
                model=target["model"], region=region, cohort=None if target["cohort"] == ANY else target["cohort"],
                destinations=[MeshDestination.model_validate(d) for d in desired["destinations"]],
                reason=f"cutover of zone {target['zone']}"), actor=ACTOR, clock=self.clock, check_versions=False)

    def _in_snapshot(self, snapshot: RoutingSnapshot, expected: dict[str, Any]) -> bool:
        target = expected["target"]
        region = None if target["route_region"] == ANY else target["route_region"]
        cohort = None if target["cohort"] == ANY else target["cohort"]
        for route in snapshot.mesh_routes:
            if (route.model, route.region, route.cohort) == (target["model"], region, cohort):
                return sorted(_key(d.model_dump()) + f"={d.weight}" for d in route.destinations) == sorted(
                    _key(d) + f"={d['weight']}" for d in expected["destinations"])
        return not expected["destinations"]
