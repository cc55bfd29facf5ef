"""Mounts every domain's router under /api/v1 and documents the errors each route can answer."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.dependencies.utils import get_flat_params
from fastapi.routing import APIRoute
from pydantic import BaseModel

from controlplane.agent_report.endpoints import router as agent_report_router
from controlplane.alerts.endpoints import router as alerts_router
from controlplane.auth.endpoints import router as auth_router
from controlplane.drill.endpoints import router as drill_router
from controlplane.event.endpoints import router as event_router
from controlplane.gateway_report.endpoints import router as gateway_report_router
from controlplane.mesh_route.endpoints import router as mesh_route_router
from controlplane.pool_plan.endpoints import router as pool_plan_router
from controlplane.replication.endpoints import router as replication_router
from controlplane.slo.endpoints import router as slo_router
from controlplane.snapshot.endpoints import router as snapshot_router
from controlplane.topology.endpoints import router as topology_router
from cutover.endpoints import router as cutover_router
from weight_catalog.endpoints import router as catalog_router

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | None = None


class ErrorResponse(BaseModel):
    """The one error shape (common.errors); branch on `error.type`, listed in docs/controlplane.md."""

    error: ErrorDetail


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": description}


def document_errors(route: APIRoute) -> None:
    """Add the error responses a route can give to its OpenAPI entry (existing entries win).

    413 and the 422 of a body JSON cannot carry come from middleware in front
    of every route (controlplane/body_limit.py, controlplane/json_body.py),
    so every route that can receive them lists them. The 422 is the one
    error shape too: FastAPI's own default for it, `HTTPValidationError`
    (`{"detail": [...]}`), is a body this app never sends.
    """
    responses: dict[int | str, Any] = {
        401: _error("no bearer token, or an unknown or revoked one (`unauthenticated`)"),
        403: _error("the token's role may not do this (`forbidden`)"),
        413: _error("the request body is over `max_request_bytes`, refused before routing (`request_too_large`)"),
        503: _error("the database is down or does not answer (`database_unavailable`, with Retry-After)"),
    }
    if "{" in route.path or route.methods & MUTATING:  # a change's body can name a thing too (a cluster's region)
        responses[404] = _error("a named thing does not exist (`<thing>_not_found`)")
    if get_flat_params(route.dependant) or route.body_field is not None or route.methods & MUTATING:
        responses[422] = _error("a parameter or the body is invalid, or the body holds text JSON cannot carry "
                                "(`invalid_request`, `param` naming it)")
    if route.methods & MUTATING:
        responses[409] = _error("the change conflicts with current state (a compare-and-set lost, a guard refused, "
                                "or the database aborted it for a concurrent one: `transaction_aborted`)")
    for status, entry in responses.items():
        route.responses.setdefault(status, entry)


def build_api_router() -> APIRouter:
    api = APIRouter(prefix="/api/v1")
    for router in (auth_router, topology_router, snapshot_router, event_router, gateway_report_router,
                   agent_report_router, pool_plan_router, catalog_router, cutover_router, mesh_route_router, drill_router,
                   slo_router, replication_router, alerts_router):
        # On the domain's own routes, before including: FastAPI includes
        # routers lazily, so the including router holds no APIRoutes to edit.
        for route in router.routes:
            if isinstance(route, APIRoute):
                document_errors(route)
        api.include_router(router)
    return api
