"""Composition root: `create_app()` builds everything; nothing is built at import."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

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
from controlplane.snapshot.body_cache import SnapshotBodyCache
from controlplane.topology.lease import GuardedLeaseReader, LeaseReader, NoLeaseRegistry, RedisLeaseReader

if TYPE_CHECKING:
    from cutover.runtime import CutoverRuntime


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


def _cutover_runtime(settings: ControlPlaneSettings, state: Any) -> CutoverRuntime:
    """The cutover workflow's one runtime (cutover/runtime.py): the snapshot's l7 and mesh, confirmed through the
    gateways' reports, and the drivers, policy and capacity plans of `cutover_drivers_file`.

    A bad file stops start-up naming its key (`CutoverDriverConfigError`).
    """
    from cutover.drivers.snapshot_l7 import ReportedGatewayVersions
    from cutover.runtime import build_runtime

    gateways = ReportedGatewayVersions(state.read_session_factory, clock=state.clock,
                                       stale_after=settings.gateway_report_stale_after)
    return build_runtime(settings, factory=state.session_factory, read_factory=state.read_session_factory,
                         clock=state.clock, gateways=gateways)


def _alert_routes(settings: ControlPlaneSettings) -> object | None:
    """The alert routes file, read once; a bad one stops start-up naming its key."""
    if settings.alert_routes_file is None:
        return None
    from controlplane.alerts.routes import load

    return load(settings.alert_routes_file)


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
    from cutover.repository import mesh_route_holders

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
    app.state.snapshot_body_cache = SnapshotBodyCache()  # a changed snapshot is built once, for every poller
    # every cutover, zonal shift and escalation acts with this one (a test may replace it)
    app.state.cutover_runtime = _cutover_runtime(settings, app.state)
    # who may still restore a mesh route (its cutovers), which a route's delete asks (controlplane/mesh_route)
    app.state.mesh_route_holders = mesh_route_holders
    app.state.alert_routes = _alert_routes(settings)
    from controlplane.slo.service import dns_ttls

    app.state.dns_ttls = dns_ttls(settings)  # the drivers file's record TTLs, for the SLO document: read once
    from controlplane.drill.exposition import DrillCollector
    from controlplane.slo.exposition import SloCollector
    from cutover.exposition import CutoverCollector

    app.state.metrics = ControlPlaneMetrics(collectors=[  # from the database, at scrape time
        build_replication_collector(session_factory=app.state.read_session_factory, clock=app.state.clock,
                                    s3_endpoint_url=settings.s3_endpoint_url),  # replication lag, RPO_context
        CutoverCollector(app.state.read_session_factory, clock=app.state.clock),  # cutovers by tier and state
        DrillCollector(app.state.read_session_factory),  # when each drill last passed, when one is due
        SloCollector(app.state.read_session_factory, clock=app.state.clock, dns=app.state.dns_ttls,
                     gateway_stale_after=settings.gateway_report_stale_after,
                     agent_stale_after=settings.agent_report_stale_after)])  # each SLO target's verdict
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
