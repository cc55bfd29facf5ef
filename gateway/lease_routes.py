"""The lease endpoint engines register and renew through (the in-process registry's; works for Redis too).

Every route needs the bearer token `registry.token`; without one configured the endpoint is off.
"""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request

from common.errors import LifelineError
from common.logs import get_logger
from contract.lease import Registration
from gateway.errors import BadRequest, Unauthorized
from gateway.prompts import read_body
from gateway.schemas import LeaseRegistration, LeaseRenewal
from gateway.state import GatewayState, State

log = get_logger(__name__)
router = APIRouter(prefix="/lifeline/v1/leases")


def _authorize(request: Request, st: GatewayState) -> None:
    token = st.settings.registry.token
    if not token:
        raise Unauthorized("the lease endpoint is disabled: set registry.token")
    presented = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
    if not hmac.compare_digest(presented.encode(), token.encode()):
        st.metrics.lease_rejections.labels(type="unauthorized").inc()
        raise Unauthorized("bad or missing bearer token")


@router.post("", status_code=201)
async def register(request: Request, st: State) -> dict:
    _authorize(request, st)
    body = await read_body(request, LeaseRegistration, max_bytes=st.settings.max_body_bytes)
    if body.region != st.settings.region:
        raise BadRequest(f"region {body.region!r} is not this gateway's region {st.settings.region!r}", param="region")
    if body.version not in {v.version for v in st.table.versions()}:
        raise BadRequest(f"version {body.version!r} is not served through this gateway", param="version")
    lease = await st.registry.register(Registration(**body.model_dump()))
    log.info("lease registered", instance=lease.instance_id, generation=lease.generation, url=lease.url)
    return {**lease.public(), "ttl_s": st.registry.ttl.total_seconds()}


@router.put("/{instance_id}")
async def renew(request: Request, instance_id: str, st: State) -> dict:
    _authorize(request, st)
    body = await read_body(request, LeaseRenewal, max_bytes=st.settings.max_body_bytes)
    try:
        lease = await st.registry.renew(instance_id, body.generation)
    except LifelineError as exc:
        st.metrics.lease_rejections.labels(type=exc.error_type).inc()
        raise
    return {**lease.public(), "ttl_s": st.registry.ttl.total_seconds()}


@router.delete("/{instance_id}")
async def release(request: Request, instance_id: str, generation: int, st: State) -> dict:
    _authorize(request, st)
    await st.registry.release(instance_id, generation)
    log.info("lease released", instance=instance_id, generation=generation)
    return {"released": True}


@router.get("")
async def leases(request: Request, st: State) -> dict:
    _authorize(request, st)
    return {"leases": [lease.public() for lease in await st.registry.live()]}
