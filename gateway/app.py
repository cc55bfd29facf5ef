"""The gateway's composition root: `create_app(settings)` wires routers, error handlers and the lifespan.

Nothing is built at import. The lifespan builds, in order, the routing table
(`build_routing_table`), the lease registry (`build_registry`) and its view,
the token log (`build_token_log`), the router and the engine client, and
keeps them on `app.state.gateway` (`state.GatewayState`); routes reach it
through the `State` dependency. A new source of routing (the control plane's
snapshot) or of leases plugs in by replacing one `build_*` function.

Errors: every `LifelineError` (the gateway's tree in `errors.py`, lease
refusals from `contract.lease`) is rendered by one handler in the OpenAI
shape; so are the framework's own 404/405 and parameter errors. After the
first byte of a stream an error is an SSE `error` event (`recovery.py`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog
from prometheus_client import CollectorRegistry
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from common.clock import Clock, SystemClock
from common.errors import LifelineError, error_body
from common.logs import get_logger
from contract.lease import LeaseRegistry, RedisLeaseRegistry
from contract.verdict import RedisVerdictBoard
from gateway import health_routes, lease_routes, openai_routes
from gateway.admission import Admission
from gateway.controlplane_link import build_controlplane_link
from gateway.deps import Deps
from gateway.engine_client import EngineClient
from gateway.lease_registry import InMemoryLeaseRegistry
from gateway.metrics import GatewayMetrics
from gateway.router import LeaseView, Router
from gateway.sessions import SessionKeeper
from gateway.tracing import Tracing
from gateway.verdicts import VerdictView
from gateway.routing_table import RoutingTable, StaticRoutingTable
from gateway.settings import GatewaySettings
from gateway.state import GatewayState
from gateway.token_log import MemoryTokenLog, TokenLog
from gateway.token_log_buffered import BufferedTokenLog
from gateway.token_log_redis import RedisTokenLog

log = get_logger(__name__)


def build_routing_table(settings: GatewaySettings) -> RoutingTable:
    """What the gateway may route to; a bad model_dir stops start-up here (tokenizers load now)."""
    table = StaticRoutingTable(settings.models, settings.engines)
    for version in table.versions():
        version.tokenizer  # noqa: B018
    return table


def build_registry(settings: GatewaySettings, clock: Clock) -> LeaseRegistry:
    cfg = settings.registry
    if cfg.kind == "redis":
        if cfg.url is None:  # pragma: no cover - settings validate it
            raise ValueError("registry.url is required when registry.kind is redis")
        return RedisLeaseRegistry.from_url(cfg.url, region=settings.region, prefix=cfg.key_prefix, ttl=cfg.ttl)
    return InMemoryLeaseRegistry(cfg.ttl, clock, state_path=cfg.state_dir / "generations.json" if cfg.state_dir else None)


def build_verdict_view(settings: GatewaySettings, registry: LeaseRegistry, clock: Clock,
                       metrics_registry: CollectorRegistry | None = None) -> VerdictView | None:
    """The agent's verdict board, read from the Redis that holds the leases; None without one (memory registry)."""
    if not (settings.registry.agent_verdicts and isinstance(registry, RedisLeaseRegistry)):
        return None
    board = RedisVerdictBoard(registry.redis, region=settings.region, prefix=settings.registry.key_prefix)
    return VerdictView(board, refresh_interval=settings.registry.refresh_interval.total_seconds(), clock=clock,
                       metrics_registry=metrics_registry)


def build_token_log(settings: GatewaySettings, clock: Clock, registry: CollectorRegistry | None = None) -> TokenLog:
    cfg = settings.token_log
    if cfg.kind == "redis":
        if cfg.url is None:  # pragma: no cover - settings validate it
            raise ValueError("token_log.url is required when token_log.kind is redis")
        return BufferedTokenLog(
            RedisTokenLog.from_url(cfg.url, prefix=cfg.key_prefix, retention=cfg.retention, owner_ttl=cfg.owner_ttl),
            buffer_frames=cfg.outage_buffer_frames, admit_non_resumable=cfg.admit_non_resumable,
            commit_wait=settings.recovery.stall_timeout.total_seconds(), registry=registry)
    return MemoryTokenLog(retention=cfg.retention, owner_ttl=cfg.owner_ttl, clock=clock)


def create_app(settings: GatewaySettings, *, clock: Clock | None = None) -> FastAPI:
    clock = clock or SystemClock()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        structlog.contextvars.bind_contextvars(replica=settings.replica_id)
        metrics = GatewayMetrics()
        link = build_controlplane_link(settings, clock, metrics.registry)
        table = link.routing or build_routing_table(settings)
        registry = build_registry(settings, clock)
        view = link.wrap_view(LeaseView(registry, refresh_interval=settings.registry.refresh_interval.total_seconds(), cached=settings.registry.kind == "redis",
                                        fail_static=settings.registry.fail_static.total_seconds(), clock=clock, metrics_registry=metrics.registry))
        await view.start()
        token_log = build_token_log(settings, clock, metrics.registry)
        verdicts = build_verdict_view(settings, registry, clock, metrics.registry)
        if verdicts is not None:
            await verdicts.start()
        router = Router(settings, table, view, Admission(settings.admission), clock, verdicts=verdicts)
        link.attach(router)
        await link.start(router, view)
        engines = EngineClient(connect_timeout=settings.recovery.connect_timeout.total_seconds())
        sessions = SessionKeeper(settings.sessions, table, metrics, clock)
        tracing = Tracing(settings.tracing, replica_id=settings.replica_id)
        deps = Deps(settings, router, engines, token_log, metrics, clock, settings.replica_id, served=link.served,
                    sessions=sessions, tracing=tracing)
        app.state.gateway = GatewayState(settings, table, registry, view, token_log, deps, metrics, sessions)
        log.info("gateway ready", registry=settings.registry.kind, token_log=settings.token_log.kind, port=settings.port)
        try:
            yield
        finally:
            await link.stop()
            await sessions.close()
            await view.stop()
            if verdicts is not None:
                await verdicts.stop()
            await engines.close()
            tracing.shutdown()
            await token_log.close()
            await registry.close()

    app = FastAPI(title="Lifeline gateway", lifespan=lifespan)
    app.add_exception_handler(LifelineError, _lifeline_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.include_router(openai_routes.router)
    app.include_router(lease_routes.router)
    app.include_router(health_routes.router)
    return app


async def _lifeline_error(_: Request, exc: LifelineError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status_code, headers=exc.headers())


_HTTP_TYPES = {404: "not_found_error", 405: "method_not_allowed"}


async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    """The framework's own errors (unknown route, wrong method) in the OpenAI shape."""
    error_type = _HTTP_TYPES.get(exc.status_code, "invalid_request_error" if exc.status_code < 500 else "internal_error")
    message = f"{exc.detail}" if exc.status_code != 405 else f"this route does not allow this method ({exc.detail})"
    return JSONResponse(error_body(error_type, message, code=exc.status_code), status_code=exc.status_code,
                        headers=getattr(exc, "headers", None))


async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    """A bad path or query parameter: 400 naming it, as a bad body field is."""
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    param = ".".join(str(p) for p in first["loc"][1:]) or None
    return JSONResponse(error_body("invalid_request_error", f"{param}: {first['msg']}", param=param, code=400), status_code=400)
