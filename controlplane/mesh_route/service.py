"""Mesh routes: set, delete, list, and what the snapshot carries. Never commits.

A mesh route (`contract.mesh.MeshRoute`, stored as `MeshRouteRecord`)
splits a model's requests across its versions — and, when destinations
name zones, takes a zone's share to zero — for one header cohort in one
region or in all. Operators set and delete them (`PUT` / `DELETE
/api/v1/mesh-routes`, `lifeline cutover mesh-route set|delete`: a 99/1
canary, a shadow cohort); every write bumps the routing version and writes
one `mesh.route` event with `routing_tier=mesh`, so gateways get it in the
next snapshot.

The cutover driver that moves them for a zone is
`cutover.drivers.snapshot_mesh.SnapshotMeshDriver`; a route one of its
cutovers changed cannot be deleted while that cutover may still restore
it, and which cutovers those are is the cutover domain's to say
(`RouteHolders`, wired by the composition root).

Versions a route names must be ones an alias of the model points at: the
snapshot describes only aliased versions, and a gateway can load no other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from sqlalchemy.orm import Session

from common.clock import Clock
from contract.mesh import MeshDestination, MeshRoute
from controlplane.errors import NotFound
from controlplane.event import service as event_service
from contract.routing_tier import RoutingTier
from controlplane.mesh_route import repository
from controlplane.mesh_route.errors import MeshRouteConflict, MeshRouteInUse, MeshUnknownVersion
from controlplane.mesh_route.models import ANY, MeshRouteRecord
from controlplane.mesh_route.schemas import MeshRouteRead, MeshRouteSpec
from controlplane.routing_version import service as routing_version
from weight_catalog import repository as catalog


class RouteHolders(Protocol):
    def __call__(self, session: Session, route: MeshRouteRecord) -> Sequence[int]:
        """The cutovers whose rollback would restore `route` (cutover.repository.mesh_route_holders)."""
        ...


def _read(record: MeshRouteRecord) -> MeshRouteRead:
    return MeshRouteRead(model=record.model, region=None if record.region == ANY else record.region,
                         cohort=None if record.cohort == ANY else record.cohort,
                         destinations=[MeshDestination.model_validate(d) for d in record.destinations],
                         revision=record.revision, reason=record.reason, updated_by=record.updated_by)


def list_routes(session: Session) -> list[MeshRouteRead]:
    return [_read(r) for r in repository.list_routes(session)]


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
    aliased = {v.version for a, v in catalog.aliases_with_versions(session) if a.model == spec.model}
    unknown = sorted({d.version for d in spec.destinations} - aliased) if check_versions else []
    if unknown:
        raise MeshUnknownVersion(f"model {spec.model!r} has no aliased version {unknown} (aliased: {sorted(aliased)});"
                                 " the snapshot describes only versions an alias points at")
    record = repository.find_route(session, model=spec.model, region=spec.region, cohort=spec.cohort)
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


def delete_route(session: Session, *, model: str, region: str | None, cohort: str | None, reason: str, actor: str,
                 clock: Clock, held_by: RouteHolders, expected_revision: int | None = None) -> MeshRouteRead:
    """Remove one route; bumps the routing version and writes one `mesh.route` event (after: none). Never commits.

    Refused while a cutover that changed it can still be rolled back (`mesh_route_in_use`, the cutovers
    `held_by` names): its rollback restores the route's recorded weights and would find nothing to restore.
    """
    name = f"{model}/{region or ANY}/{cohort or ANY}"
    record = repository.find_route(session, model=model, region=region, cohort=cohort)
    if record is None:
        raise NotFound(f"no mesh route {name}")
    if expected_revision is not None and expected_revision != record.revision:
        raise MeshRouteConflict(f"mesh route {name} is at revision {record.revision}, not {expected_revision}")
    holders = held_by(session, record)
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
