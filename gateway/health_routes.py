"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.state import State

router = APIRouter()


@router.get("/healthz/live")
async def live() -> dict:
    return {"status": "live"}


@router.get("/healthz/ready")
async def ready(st: State) -> JSONResponse:
    routable = {v.alias: len(await st.deps.router.endpoints(v.version)) for v in st.table.versions()}
    ok = any(routable.values())
    return JSONResponse({"status": "ready" if ok else "not_ready", "routable_endpoints": routable}, status_code=200 if ok else 503)


@router.get("/metrics")
async def metrics(st: State) -> Response:
    return Response(generate_latest(st.metrics.registry), media_type=CONTENT_TYPE_LATEST)
