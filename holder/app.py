"""The holder's composition root: `create_app` replays the ledger, holds the weights, mounts the API."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from common.clock import Clock, SystemClock
from common.logs import get_logger
from holder.endpoints import router
from holder.errors import HolderError
from holder.service import MemoryHolder
from holder.settings import HolderSettings

log = get_logger(__name__)

WATCH_INTERVAL_S = 0.2  # how often lease expiry is looked at for the log; detection itself is computed at read


async def holder_error(_: Request, exc: HolderError) -> JSONResponse:  # type: ignore[override]
    return JSONResponse(exc.body(), status_code=exc.status_code, headers=exc.headers())


async def _watch_leases(holder: MemoryHolder) -> None:
    while True:
        await asyncio.sleep(WATCH_INTERVAL_S)
        holder.announce_frozen()


def create_app(settings: HolderSettings, *, clock: Clock | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        holder = MemoryHolder(settings, clock or SystemClock())
        app.state.holder = holder
        await asyncio.to_thread(holder.open)
        weights = await asyncio.to_thread(holder.ensure_weights)
        weights = await asyncio.to_thread(holder.ensure_device_copy)  # a no-op with device: cpu
        await asyncio.to_thread(holder.ensure_kv_pool)
        log.info("holder ready", epoch=holder.epoch, region=weights.region.region_id, bytes=weights.region.size,
                 shm_dir=str(holder.shm_dir), device=settings.device)
        watcher = asyncio.create_task(_watch_leases(holder))
        try:
            yield
        finally:
            watcher.cancel()
            with suppress(asyncio.CancelledError):
                await watcher
            holder.close(clean=True)
            log.info("holder stopped; regions released")

    app = FastAPI(title="Lifeline memory holder", lifespan=lifespan)
    app.add_exception_handler(HolderError, holder_error)
    app.include_router(router)
    return app


def run_server(settings: HolderSettings) -> None:
    config = uvicorn.Config(create_app(settings), host=settings.host, port=settings.port, log_level="warning",
                            access_log=False)
    uvicorn.Server(config).run()
