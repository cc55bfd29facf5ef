"""The holder's local API (loopback HTTP): thin handlers over `holder.service.MemoryHolder`.

    POST /v1/tenants/attach                       AttachRequest → AttachResponse
    POST /v1/tenants/{tenant_id}/heartbeat        GenerationBody → HeartbeatResponse
    POST /v1/tenants/{tenant_id}/confirm          GenerationBody → TenantView
    POST /v1/tenants/{tenant_id}/release          GenerationBody → TenantView
    POST /v1/tenants/{tenant_id}/kv/reserve       KVReserveRequest → KVReserveResponse
    POST /v1/tenants/{tenant_id}/kv/commit        KVCommitRequest → KVCommitResponse
    POST /v1/kv/lookup                            KVLookupRequest → KVLookupResponse
    GET  /v1/tenants                              [TenantView]
    GET  /v1/weights                              WeightsDescription
    GET  /v1/weights/snapshot                     WeightsSnapshot (a standby primes from it; no tenancy)
    GET  /v1/state                                epoch, replay report, regions, tenants
    GET  /healthz/live, /healthz/ready
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from common.request_body import parse_json_body
from contract.holder import (
    AttachRequest,
    AttachResponse,
    GenerationBody,
    HeartbeatResponse,
    KVBlockRef,
    KVCommitRequest,
    KVCommitResponse,
    KVLookupRequest,
    KVLookupResponse,
    KVReserveRequest,
    KVReserveResponse,
    TenantView,
    WeightsDescription,
    WeightsSnapshot,
)
from holder.errors import BadRequest
from holder.service import MemoryHolder


def _holder(request: Request) -> MemoryHolder:
    return request.app.state.holder


Holder = Annotated[MemoryHolder, Depends(_holder)]
router = APIRouter()


@router.post("/v1/tenants/attach", response_model=AttachResponse)
async def attach(request: Request, holder: Holder) -> AttachResponse:
    body = parse_json_body(await request.body(), AttachRequest, BadRequest)
    return holder.attach(body.tenant_id, body.generation)


@router.post("/v1/tenants/{tenant_id}/heartbeat", response_model=HeartbeatResponse)
async def heartbeat(tenant_id: str, request: Request, holder: Holder) -> HeartbeatResponse:
    body = parse_json_body(await request.body(), GenerationBody, BadRequest)
    return holder.heartbeat(tenant_id, body.generation)


@router.post("/v1/tenants/{tenant_id}/confirm", response_model=TenantView)
async def confirm(tenant_id: str, request: Request, holder: Holder) -> TenantView:
    body = parse_json_body(await request.body(), GenerationBody, BadRequest)
    return holder.confirm(tenant_id, body.generation)


@router.post("/v1/tenants/{tenant_id}/release", response_model=TenantView)
async def release(tenant_id: str, request: Request, holder: Holder) -> TenantView:
    body = parse_json_body(await request.body(), GenerationBody, BadRequest)
    return holder.release(tenant_id, body.generation)


@router.post("/v1/tenants/{tenant_id}/kv/reserve", response_model=KVReserveResponse)
async def kv_reserve(tenant_id: str, request: Request, holder: Holder) -> KVReserveResponse:
    body = parse_json_body(await request.body(), KVReserveRequest, BadRequest)
    return KVReserveResponse(blocks=holder.kv_reserve(tenant_id, body.generation, body.count))


@router.post("/v1/tenants/{tenant_id}/kv/commit", response_model=KVCommitResponse)
async def kv_commit(tenant_id: str, request: Request, holder: Holder) -> KVCommitResponse:
    body = parse_json_body(await request.body(), KVCommitRequest, BadRequest)
    ref: KVBlockRef = holder.kv_commit(tenant_id, body.generation, body.block, body.parent_hash, body.token_ids)
    return KVCommitResponse(committed=ref)


@router.post("/v1/kv/lookup", response_model=KVLookupResponse)
async def kv_lookup(request: Request, holder: Holder) -> KVLookupResponse:
    body = parse_json_body(await request.body(), KVLookupRequest, BadRequest)
    return holder.kv_lookup(body.token_ids)


@router.get("/v1/tenants", response_model=list[TenantView])
async def tenants(holder: Holder) -> list[TenantView]:
    return holder.tenants()


@router.get("/v1/weights", response_model=WeightsDescription)
async def weights(holder: Holder) -> WeightsDescription:
    return holder.ready_weights()


@router.get("/v1/weights/snapshot", response_model=WeightsSnapshot)
async def weights_snapshot(holder: Holder) -> WeightsSnapshot:
    """The sealed region and this holder's boot, read together: records nothing, leases nothing."""
    return holder.weights_snapshot()


@router.get("/v1/state")
async def state(holder: Holder) -> dict:
    return {"epoch": holder.epoch, "replay": asdict(holder.replay) if holder.replay else None,
            "regions": holder.regions(), "tenants": [t.model_dump() for t in holder.tenants()],
            "kv": holder.kv_summary()}


@router.get("/healthz/live")
async def live() -> dict:
    return {"status": "live"}


@router.get("/healthz/ready")
async def ready(holder: Holder) -> JSONResponse:
    if holder.weights is None:
        return JSONResponse({"status": "not_ready"}, status_code=503)
    return JSONResponse({"status": "ready", "epoch": holder.epoch, "region": holder.weights.region.region_id})
