"""Mesh route routes under /api/v1. Thin: parse, call the service, shape.

    GET    /mesh-routes                 the mesh tier's version/cohort splits                 viewer
    PUT    /mesh-routes                 set one (bumps the snapshot; a mesh.route event)      operator
    DELETE /mesh-routes?model=&region=&cohort=&reason=  remove one (same; not while a cutover holds it)  operator

Documented with the cutovers (tag `cutover`, docs/cutover.md), whose mesh
tier they are.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from controlplane.auth.dependencies import Operator, Viewer
from controlplane.db import DbSession
from controlplane.mesh_route import service
from controlplane.mesh_route.schemas import COHORT_PATTERN, MeshRouteRead, MeshRouteSpec
from controlplane.mesh_route.service import RouteHolders

router = APIRouter(tags=["cutover"])


def route_holders(request: Request) -> RouteHolders:
    """Who may still restore a route: the cutover domain's query, which the composition root sets (controlplane/app.py)."""
    holders: RouteHolders | None = getattr(request.app.state, "mesh_route_holders", None)
    if holders is None:
        raise RuntimeError("app.state.mesh_route_holders is not set: create_app wires the cutovers that hold a route")
    return holders


@router.get("/mesh-routes", response_model=list[MeshRouteRead])
def list_mesh_routes(session: DbSession, _: Viewer) -> list[MeshRouteRead]:
    return service.list_routes(session)


@router.put("/mesh-routes", response_model=MeshRouteRead)
def put_mesh_route(body: MeshRouteSpec, request: Request, session: DbSession, principal: Operator) -> MeshRouteRead:
    """Set a model's version/zone weights for one cohort (a 99/1 canary, a shadow cohort); gateways follow the snapshot."""
    return service.put_route(session, body, actor=principal.actor, clock=request.app.state.clock)


@router.delete("/mesh-routes", response_model=MeshRouteRead)
def delete_mesh_route(
    request: Request,
    session: DbSession,
    principal: Operator,
    held_by: Annotated[RouteHolders, Depends(route_holders)],
    model: Annotated[str, Query(min_length=1, max_length=128, pattern=r"^[^\x00]*$")],
    reason: Annotated[str, Query(min_length=1, max_length=2000, pattern=r"^[^\x00]*$")],
    region: Annotated[str | None, Query(min_length=1, max_length=128, pattern=r"^[^\x00]*$",
                                        description="omitted: the route for every region")] = None,
    cohort: Annotated[str | None, Query(pattern=COHORT_PATTERN, description="omitted: the default route")] = None,
    expected_revision: Annotated[int | None, Query(ge=0, le=2**31 - 1)] = None,
) -> MeshRouteRead:
    """Remove one mesh route (answers with it as it was); 404 if there is none, 409 while a cutover holds it."""
    return service.delete_route(session, model=model, region=region, cohort=cohort, reason=reason,
                                actor=principal.actor, clock=request.app.state.clock, held_by=held_by,
                                expected_revision=expected_revision)
