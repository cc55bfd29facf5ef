"""The built-in mesh tier: mesh routes in Lifeline's own gateways, moved through the control plane's snapshot.

The routes themselves (set and deleted by operators, carried by the
snapshot) are the control plane's mesh_route domain (controlplane/mesh_route/). For a cutover of a zone each route that
names the zone is a step:

    target (cutover/drivers/step.py)                        state
    MeshRouteTarget(model, route_region, cohort,            MeshRouteState(destinations: [MeshDestination
                    zone, region)                                          (version, zone, weight)])

"out" takes the zone's destinations to 0 and gives their share to the
others in proportion (`cutover.drivers.adapter.mesh_weights`, the same rule as the
Istio driver), "in" gives each an even share back; rollback restores the
recorded weights. It verifies as the l7 tier does
(`cutover.drivers.snapshot_l7`): the route as the snapshot shows it, then
every fresh gateway of the region on that snapshot version or a newer one.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from contract.mesh import MeshDestination
from contract.routing_tier import RoutingTier
from contract.snapshot import RoutingSnapshot
from controlplane.db import session_scope
from controlplane.mesh_route import repository as mesh_routes
from controlplane.mesh_route.errors import MeshRouteConflict
from controlplane.mesh_route.models import ANY
from controlplane.mesh_route.schemas import MeshRouteSpec
from controlplane.mesh_route.service import put_route
from cutover.drivers.adapter import mesh_weights
from cutover.drivers.snapshot_l7 import ACTOR, SnapshotL7Driver
from cutover.drivers.step import MeshRouteState, MeshRouteTarget
from cutover.scope import Scope, ScopeKind, TargetState


def _key(destination: MeshDestination) -> str:
    return f"{destination.version}@{destination.zone or ANY}"


class SnapshotMeshDriver(SnapshotL7Driver):
    """The mesh tier through the snapshot: a zone's destinations of each mesh route (see the module docstring)."""

    tier = RoutingTier.MESH
    name = "snapshot"

    def targets(self, scope: Scope, *, generation: int | None = None) -> list[MeshRouteTarget]:  # type: ignore[override]
        if scope.kind != ScopeKind.ZONE:
            return []  # an instance is l7's; a whole region is dns's (a route cannot send nowhere)
        with session_scope(self.read_factory) as session:
            rows = mesh_routes.routes_for_region(session, region=scope.region)
            return [MeshRouteTarget(model=r.model, route_region=r.region, cohort=r.cohort, zone=scope.name,
                                    region=scope.region)
                    for r in rows if any(d.get("zone") == scope.name for d in r.destinations)]

    def desired(self, before: MeshRouteState, target_state: TargetState) -> MeshRouteState:  # type: ignore[override]
        zone = before.target.zone
        destinations = before.destinations
        weights = mesh_weights({_key(d): d.weight for d in destinations},
                               [_key(d) for d in destinations if d.zone == zone], target_state)
        return before.model_copy(update={
            "destinations": tuple(d.model_copy(update={"weight": weights[_key(d)]}) for d in destinations)})

    def _read(self, session: Session, target: MeshRouteTarget) -> MeshRouteState:  # type: ignore[override]
        record = mesh_routes.find_route(session, model=target.model, region=target.route_region,
                                        cohort=target.cohort)
        if record is None:
            return MeshRouteState(target=target, destinations=())
        return MeshRouteState(target=target,
                              destinations=tuple(MeshDestination.model_validate(d) for d in record.destinations))

    def apply(self, desired: MeshRouteState) -> None:  # type: ignore[override]
        target = desired.target
        with session_scope(self.factory) as session:
            current = self._read(session, target)
            if current == desired:
                return  # idempotent: a resumed step finds its change already made
            if not current.destinations:
                raise MeshRouteConflict(f"mesh route {target.model}/{target.route_region}/{target.cohort} "
                                        "no longer exists")
            region = None if target.route_region == ANY else target.route_region
            put_route(session, MeshRouteSpec(
                model=target.model, region=region, cohort=None if target.cohort == ANY else target.cohort,
                destinations=list(desired.destinations),
                reason=f"cutover of zone {target.zone}"), actor=ACTOR, clock=self.clock, check_versions=False)

    def _in_snapshot(self, snapshot: RoutingSnapshot, expected: MeshRouteState) -> bool:  # type: ignore[override]
        target = expected.target
        region = None if target.route_region == ANY else target.route_region
        cohort = None if target.cohort == ANY else target.cohort
        for route in snapshot.mesh_routes:
            if (route.model, route.region, route.cohort) == (target.model, region, cohort):
                return sorted(f"{_key(d)}={d.weight}" for d in route.destinations) == sorted(
                    f"{_key(d)}={d.weight}" for d in expected.destinations)
        return not expected.destinations
