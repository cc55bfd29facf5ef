"""Mounts every domain's router under /api/v1."""

from __future__ import annotations

from fastapi import APIRouter

from controlplane.auth.endpoints import router as auth_router
from controlplane.event.endpoints import router as event_router
from controlplane.snapshot.endpoints import router as snapshot_router
from controlplane.topology.endpoints import router as topology_router
from weight_catalog.endpoints import router as catalog_router


def build_api_router() -> APIRouter:
    api = APIRouter(prefix="/api/v1")
    for router in (auth_router, topology_router, snapshot_router, event_router, catalog_router):
        api.include_router(router)
    return api
