"""Composition root: `create_app()` builds everything; nothing is built at import."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from controlplane.auth.audit import AuditMiddleware, bearer_actor
from common.clock import Clock, SystemClock
from controlplane.body_limit import BodyLimitMiddleware
from controlplane.config import ControlPlaneSettings
from controlplane.db import build_engine, build_session_factory
from controlplane.errors import install_error_handlers
from controlplane.json_body import JsonBodyMiddleware
from controlplane.health import router as health_router
from controlplane.metrics import ControlPlaneMetrics, RequestMetricsMiddleware
from controlplane.metrics import router as metrics_router
from controlplane.replication.exposition import build_collector as build_replication_collector
from controlplane.topology.lease import GuardedLeaseReader, LeaseReader, NoLeaseRegistry, RedisLeaseReader


def _lease_reader(settings: ControlPlaneSettings) -> LeaseReader:
    if settings.lease_redis_url is None:
        return NoLeaseRegistry()
    from common.redis_url import redis_client

    # redis:// or redis+sentinel://; both timeouts bounded (a registry that accepts and never answers
    # must not hold a worker thread): `?socket_timeout=2` in the URL, 1 s by default.
    client = redis_client(settings.lease_redis_url)
    return GuardedLeaseReader(RedisLeaseReader(client, prefix=settings.lease_key_prefix))


def _drill_dispatch(settings: ControlPlaneSettings, clock: Clock) -> Callable[[int], None] | None:
    """How an API-requested drill run starts: the Celery task (in-process when no broker is set).

    None without a fleet file: the run stays `scheduled`, as `lifeline drill run` documents.
    """
    if settings.drill_fleet_file is None:
        return None
    from controlplane.celery_app import create_celery
    from controlplane.drill.tasks import RUN

    run = create_celery(settings, clock=clock).tasks[RUN]

    def dispatch(run_id: int) -> None:
        run.delay(run_id)

    return dispatch


def _cutover_wiring(settings: ControlPlaneSettings) -> tuple[list[object], object | None, object | None]:
    """The tiers' drivers, the cutover policy and the capacity plans from `cutover_drivers_file`.

    A bad file stops start-up naming its key. The drivers poll real routing systems, so they time their
    timeouts and time to effect on the system clock, whatever clock the app is given. No `[policy]`
    table: None (the code defaults); no `[[capacity.plans]]`: None (`assertion.capacity` is skipped).
    """
    if settings.cutover_drivers_file is None:
        return [], None, None
    from cutover.driver_config import build_drivers, load

    config = load(settings.cutover_drivers_file)
    return (list(build_drivers(config, clock=SystemClock())), config.policy.build() if config.policy else None,
            config.capacity.build() if config.capacity else None)


def create_app(
    settings: ControlPlaneSettings | None = None,
    *,
    clock: Clock | None = None,
    lease_reader: LeaseReader | None = None,
) -> FastAPI:
    from controlplane.api import build_api_router
    from controlplane.console import build_console_router
    from controlplane.console.session import cookie_actor as console_cookie_actor
    from controlplane.console.web import install_error_pages as install_console_error_pages

    settings = settings or ControlPlaneSettings()
    engine = build_engine(settings.resolved_database_url(), timeouts=settings.database_timeouts())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        from cutover.endpoints import start_expiry_loop

        # Zonal shifts end by themselves at expiry, in every control-plane process (state in the DB).
        expiry = start_expiry_loop(app.state)
        try:
            yield
        finally:
            expiry.stop()
            engine.dispose()

    app = FastAPI(
        title="Lifeline control plane",
        version="1",
        description="Topology, weight catalog, events and the routing snapshot gateways follow.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.session_factory = build_session_factory(engine)
    app.state.read_session_factory = build_session_factory(engine, read_only=True)
    app.state.clock = clock or SystemClock()
    app.state.lease_reader = lease_reader or _lease_reader(settings)
    app.state.drill_dispatch = _drill_dispatch(settings, app.state.clock)
    # the cutover tiers' drivers, policy and capacity plans (cutover/driver_config.py)
    wiring = _cutover_wiring(settings)
    app.state.cutover_drivers, app.state.cutover_policy, app.state.cutover_capacity = wiring
    app.state.metrics = ControlPlaneMetrics(collectors=[build_replication_collector(
        session_factory=app.state.read_session_factory, clock=app.state.clock,
        s3_endpoint_url=settings.s3_endpoint_url)])  # replication lag and RPO_context, at scrape time
    install_error_handlers(app)
    install_console_error_pages(app)  # the same refusals, as pages under /console
    # The last added is outermost: an oversized body is refused before anything parses it, and audited;
    # so is a body holding text JSON cannot carry (NaN, a lone surrogate); every answer is counted, a refused one too.
    app.add_middleware(JsonBodyMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_bytes)
    # who a refused call's credential names: the bearer token, or the console's session cookie
    app.add_middleware(AuditMiddleware, identify=(bearer_actor, console_cookie_actor))
    app.add_middleware(RequestMetricsMiddleware, metrics=app.state.metrics)
    app.include_router(build_api_router())
    app.include_router(build_console_router())  # the operator console under /console (docs/console.md)

    app.include_router(health_router)
    app.include_router(metrics_router)
    return app
