"""Admin routes for KV blocks (only with `--enable-kv-admin`): thin handlers over `engine.kv_transfer`.

    GET  /admin/kv          the validity tuple, its root hash, the prefix cache and the checkpoint store
    POST /admin/kv/export   {"token_ids": [...]} → the cached blocks of that prefix, one safetensors bundle
    POST /admin/kv/import   a bundle (application/octet-stream) → verified, then installed in the prefix cache
    POST /admin/kv/checkpoint  contract.session.KVCheckpointRequest → the prefix's full blocks written to the
                            checkpoint store (those the prefix cache lacks computed first), then the manifest;
                            answers contract.session.KVCheckpointWritten once both are stored

Refusals are typed and install nothing: 400 kv_checkpoint_invalid, 404 kv_blocks_absent, 409
kv_validity_mismatch (names the fields that differ), 413 kv_import_too_large; a checkpoint without a
`--kv-checkpoint-store` is 409 kv_checkpoint_store_absent, one the store did not take 503 kv_store_unavailable.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from common.request_body import parse_json_body
from contract.kv_checkpoint import KVStoreUnavailable, manifest_key
from contract.session import KVCheckpointRequest, KVCheckpointWritten
from engine.errors import (
    BadRequest,
    KVBlocksAbsent,
    KVCheckpointStoreAbsent,
    KVImportTooLarge,
    KVStoreDown,
)
from engine.kv_transfer import export_bundle, import_bundle
from engine.runtime import EngineRuntime
from engine.serving import OpenAIServing


def _runtime(request: Request) -> EngineRuntime:
    return request.app.state.runtime


Runtime = Annotated[EngineRuntime, Depends(_runtime)]


def _serving(request: Request) -> OpenAIServing:
    return request.app.state.serving


Serving = Annotated[OpenAIServing, Depends(_serving)]

kv_router = APIRouter()


class KVExportRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    token_ids: list[int] = Field(min_length=1, max_length=1 << 17)


@kv_router.get("/admin/kv")
async def kv_summary(runtime: Runtime) -> dict:
    cache = runtime.prefix_cache
    return {"validity": runtime.kv_validity.model_dump() if runtime.kv_validity else None,
            "root_hash": cache.root_hash if cache else None,
            "prefix_cache": cache.summary() if cache else None,
            "checkpoint_store": runtime.checkpointer.store.store.location if runtime.checkpointer else None,
            "checkpoint_every_tokens": runtime.checkpointer.every_tokens if runtime.checkpointer else None}


@kv_router.post("/admin/kv/export")
async def kv_export(request: Request, runtime: Runtime) -> Response:
    body = parse_json_body(await request.body(), KVExportRequest, BadRequest)
    exported = await asyncio.to_thread(export_bundle, runtime.prefix_cache, body.token_ids,
                                       instance_id=runtime.settings.instance_id, clock=runtime.clock)
    return Response(exported.data, media_type="application/octet-stream",
                    headers={"X-Lifeline-KV-Blocks": str(exported.blocks), "X-Lifeline-KV-Tokens": str(exported.tokens),
                             "X-Lifeline-KV-Root": exported.root_hash})


async def _bounded_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise KVImportTooLarge(f"a KV bundle of {declared} bytes is over the limit of {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise KVImportTooLarge(f"a KV bundle over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


@kv_router.post("/admin/kv/import")
async def kv_import(request: Request, runtime: Runtime) -> dict:
    data = await _bounded_body(request, runtime.settings.kv_import_max_bytes)
    return await asyncio.to_thread(import_bundle, runtime.prefix_cache, data, runtime.metrics)


@kv_router.post("/admin/kv/checkpoint")
async def kv_checkpoint(request: Request, runtime: Runtime, serving: Serving) -> dict:
    """Checkpoint a session's context now: the KV of its full blocks, from this engine, into its store."""
    body = parse_json_body(await request.body(), KVCheckpointRequest, BadRequest)
    written = await checkpoint_prefix(runtime, serving, body.token_ids, request_id=body.request_id,
                                      session_class=body.session_class)
    return written.model_dump()


async def checkpoint_prefix(runtime: EngineRuntime, serving: OpenAIServing, token_ids: list[int], *,
                            request_id: str | None, session_class: str | None) -> KVCheckpointWritten:
    """The KV of the prefix's full blocks in the store (prefilled first where the prefix cache lacks them): what
    `/admin/kv/checkpoint` and a completion's `kv_transfer_params.lifeline_checkpoint` both do."""
    checkpointer, cache = runtime.checkpointer, runtime.prefix_cache
    if checkpointer is None or cache is None:
        raise KVCheckpointStoreAbsent("this engine has no checkpoint store (--kv-checkpoint-store)")
    token_ids = serving.checked_token_ids(token_ids, "token_ids")
    size = checkpointer.block_tokens
    full = token_ids[:len(token_ids) // size * size]
    if not full:
        raise KVBlocksAbsent(f"a prefix of {len(token_ids)} tokens holds no full block of {size}")
    computed = 0
    if cache.cached_blocks(full) < len(full) // size:
        computed = len(full) - await serving.prefill(full, f"kvckpt-{uuid.uuid4().hex}")
    blocks = cache.blocks(full)
    if not blocks:
        raise KVBlocksAbsent("the prefix cache evicted the blocks before they were written")
    try:
        manifest = await asyncio.to_thread(checkpointer.write_chain, blocks, request_id, session_class)
    except KVStoreUnavailable as exc:
        raise KVStoreDown(f"the checkpoint store did not take the checkpoint: {exc}") from None
    return KVCheckpointWritten(root_hash=manifest.root_hash, last_hash=manifest.last_hash,
                               key=manifest_key(manifest.root_hash, manifest.last_hash), blocks=len(blocks),
                               tokens=len(blocks) * size, computed_tokens=computed)
