"""Liveness, readiness and Prometheus metrics.

`/healthz/ready` details say which Redis each store reaches and in which role
(`common.redis_url.describe`: address, `master`/`slave`, Sentinel service),
whether the lease view is fresh or failing static (and how old it is), and
whether the token log answers. A gateway whose fail-static window is over
answers 503 here, as it does to new requests.
"""

from __future__ import annotations

import asyncio
import math

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from common.redis_url import describe
from gateway.router import lease_view_of
from gateway.state import State

router = APIRouter()


@router.get("/healthz/live")
async def live() -> dict:
    return {"status": "live"}


@router.get("/healthz/ready")
async def ready(st: State) -> JSONResponse:
    routable = {v.alias: len(await st.deps.router.endpoints(v.version)) for v in st.table.versions()}
    body: dict = {"routable_endpoints": routable}
    view = lease_view_of(st.view)
    stale = False
    if view is not None and view.cached:
        stale = view.stale()
        age = view.age()
        body["lease_view"] = {"registry_available": view.available, "age_s": None if math.isinf(age) else round(age, 3),
                              "fail_static_s": view.fail_static, "mode": "refusing" if stale else
                              ("fresh" if view.available else "fail_static")}
    redis_details = {}
    for name, store, url in (("lease_registry", st.registry, st.settings.registry.url),
                             ("token_log", st.token_log, st.settings.token_log.url)):
        client = getattr(store, "redis", None)
        if client is not None:
            redis_details[name] = asyncio.create_task(describe(client, url))
    if redis_details:
        body["redis"] = {name: await task for name, task in redis_details.items()}
        if "token_log" in body["redis"]:
            body["redis"]["token_log"]["available"] = getattr(st.token_log, "available", True)
    ok = any(routable.values()) and not stale
    body = {"status": "ready" if ok else "not_ready", **body}
    return JSONResponse(body, status_code=200 if ok else 503)


@router.get("/metrics")
async def metrics(st: State) -> Response:
    return Response(generate_latest(st.metrics.registry), media_type=CONTENT_TYPE_LATEST)
