"""The engine's composition root: `create_app` wires the routers and owns the lifespan.

Endpoints (see `engine.api_router`): POST /v1/completions, POST
/v1/chat/completions, GET /v1/models, GET /health, GET /metrics, GET
/healthz/{live,ready,generation,weights}, with `--enable-fault-admin` GET/POST
/admin/faults, and with `--enable-kv-admin` GET /admin/kv, POST /admin/kv/{export,import}. Every error leaves in the OpenAI shape (`engine.errors`).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import FrameType

from http import HTTPStatus

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from common.clock import Clock, SystemClock
from common.logs import get_logger
from engine.api_router import admin_router, health_router, openai_router
from engine.kv_router import kv_router
from common.errors import error_body
from engine.drain import GRACEFUL_SHUTDOWN_S, Drainer
from contract.sampling import Sampling
from engine.errors import EngineError, MethodNotAllowed, NotFound
from engine.lease_client import LeaseClient, transport_for
from engine.lifecycle import LifecycleEvent
from engine.runtime import EngineRuntime, load_runtime, self_test
from engine.serving import OpenAIServing
from engine.settings import EngineSettings, FaultSettings

log = get_logger(__name__)


class GenerationHeaders:
    """Stamps `X-Lifeline-Instance` on every response, and `X-Lifeline-Generation` when we hold our own lease.

    The gateway refuses frames whose generation differs from the lease it
    routed by; that fences a restarted self-leasing engine. An engine without
    `--registry` leaves the header out (`EngineRuntime.fences_by_generation`):
    the lease that routes to it is the agent's, under the agent's generation.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        runtime: EngineRuntime | None = getattr(scope["app"].state, "runtime", None)

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start" and runtime is not None:
                headers = list(message.get("headers", []))
                headers.append((b"x-lifeline-instance", runtime.settings.instance_id.encode()))
                if runtime.fences_by_generation:
                    headers.append((b"x-lifeline-generation", str(runtime.generation).encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, stamped)


def start_lease_client(runtime: EngineRuntime, registry_url: str) -> LeaseClient:
    """Register only once ready: a lease means "route here"."""
    settings = runtime.settings
    registration = {
        "instance_id": settings.instance_id,
        "url": settings.advertise_url or f"http://{settings.host}:{settings.port}",
        "version": settings.model_name,
        "zone": settings.zone,
        "region": settings.region,
        "sampling": Sampling.POSITION_KEYED.value,  # engine/sampling.py: the token at i is keyed by (seed, i)
    }
    client = LeaseClient(
        transport_for(registry_url, settings.registry_token, registration),
        on_generation=runtime.adopt_lease_generation,
        on_lapsed=lambda: runtime.apply(LifecycleEvent.LEASE_LAPSED),
        on_superseded=lambda: runtime.apply(LifecycleEvent.SUPERSEDED),
        clock=runtime.clock,
    )
    client.start()
    return client


async def engine_error(_: Request, exc: EngineError) -> JSONResponse:  # type: ignore[override]
    return JSONResponse(exc.body(), status_code=exc.status_code, headers=exc.headers())


_FRAMEWORK_ERRORS: dict[int, type[EngineError]] = {404: NotFound, 405: MethodNotAllowed}


async def framework_error(_: Request, exc: HTTPException) -> JSONResponse:  # type: ignore[override]
    """Starlette's own 404/405 (no route, wrong method) in the OpenAI shape; `Allow` is kept."""
    known = _FRAMEWORK_ERRORS.get(exc.status_code)
    error_type = known.error_type if known else HTTPStatus(exc.status_code).phrase.replace(" ", "") + "Error"
    return JSONResponse(error_body(error_type, str(exc.detail), code=exc.status_code), status_code=exc.status_code,
                        headers=exc.headers)


def create_app(settings: EngineSettings, fault_settings: FaultSettings | None = None, *,
               clock: Clock | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = await load_runtime(settings, fault_settings or FaultSettings(), clock or SystemClock())
        app.state.runtime = runtime
        app.state.serving = OpenAIServing(runtime)
        await self_test(runtime)
        tenancy = runtime.weights_origin.tenancy
        if tenancy is not None:
            await asyncio.to_thread(tenancy.confirm)  # a consistent view: the holder may end a takeover
        log.info("engine ready", weights_digest=runtime.weights_digest, weights_source=runtime.weights_origin.source)
        lease = start_lease_client(runtime, settings.registry) if settings.registry else None
        app.state.lease_client = lease  # /healthz/ready names the registry it renews against
        app.state.drainer = Drainer(runtime, app.state.serving, lease)
        try:
            yield
        finally:
            await app.state.drainer.step_down()
            runtime.scheduler.stop()
            if runtime.checkpointer is not None:
                await asyncio.to_thread(runtime.checkpointer.close)
            if runtime.weights_origin.kv_pool is not None:
                await asyncio.to_thread(runtime.weights_origin.kv_pool.close)
            if tenancy is not None:
                await asyncio.to_thread(tenancy.release)
            log.info("engine stopped")

    app = FastAPI(title="Lifeline reference engine", lifespan=lifespan)
    app.add_middleware(GenerationHeaders)
    app.add_exception_handler(EngineError, engine_error)
    app.add_exception_handler(HTTPException, framework_error)
    app.include_router(openai_router)
    app.include_router(health_router)
    if settings.enable_fault_admin:
        app.include_router(admin_router)
    if settings.enable_kv_admin:
        app.include_router(kv_router)
    return app


class DrainingServer(uvicorn.Server):
    """uvicorn, except that the first SIGTERM drains (engine.drain) before uvicorn stops listening."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self.app = app
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task | None = None

    async def serve(self, sockets=None) -> None:  # type: ignore[no-untyped-def]  # noqa: ANN001
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        drainer: Drainer | None = getattr(self.app.state, "drainer", None)
        if sig == signal.SIGTERM and drainer is not None and self._loop is not None and self._drain_task is None \
                and not self.should_exit:
            self._loop.call_soon_threadsafe(self._start_drain, drainer)
            return
        super().handle_exit(sig, frame)

    def _start_drain(self, drainer: Drainer) -> None:
        if self._drain_task is None:
            self._drain_task = asyncio.ensure_future(self._drain_then_exit(drainer))

    async def _drain_then_exit(self, drainer: Drainer) -> None:
        try:
            await drainer.drain()
        finally:
            self.should_exit = True


def run_server(settings: EngineSettings, fault_settings: FaultSettings) -> None:
    app = create_app(settings, fault_settings)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
    DrainingServer(config, app).run()
