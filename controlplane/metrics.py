"""Prometheus metrics of the control-plane process, served at `GET /metrics`.

    lifeline_controlplane_requests_total{method,route,status}   every answered request
    lifeline_controlplane_request_seconds{method,route}         time to the response's first byte
    lifeline_controlplane_requests_in_flight                    requests being answered now

`route` is the matched route's template (`/api/v1/cutovers/{cutover_id}`),
never the raw path, so a scanner walking random URLs cannot grow the
series without bound: anything no route matched is `unmatched`. The page
also carries the process's default registry, where the drill runner's
metrics live (`controlplane.drill.metrics`) when a drill runs in this
process, and the collectors create_app hands in, computed at scrape time:
KV replication lag and RPO_context per policy and destination, from the
database and the stores (`controlplane.replication.exposition`, bounded by a
probe TTL and a read cap). The handler is a plain `def`, so those reads run
in the thread pool, never on the event loop. Like the engine's and the gateway's, it needs no token: it holds
counts, not secrets, and a scraper should not hold an API token.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from fastapi import APIRouter, Request
from fastapi.responses import Response
from fastapi.routing import iter_route_contexts
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNMATCHED = "unmatched"


class ControlPlaneMetrics:
    """One app's metrics, in a registry of their own (tests build many apps in one process)."""

    def __init__(self, collectors: Iterable[Collector] = ()) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("lifeline_controlplane_requests_total", "Requests answered, by route and status",
                                ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram("lifeline_controlplane_request_seconds", "Time to the response's first byte",
                                 ["method", "route"], registry=self.registry,
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.in_flight = Gauge("lifeline_controlplane_requests_in_flight", "Requests being answered now",
                               registry=self.registry)
        for collector in collectors:
            self.registry.register(collector)

    def render(self) -> bytes:
        return generate_latest(self.registry) + generate_latest(REGISTRY)


class RouteTemplates:
    """The full template of each route (`/api/v1/clusters/{name}`), found once the app's routes are final.

    `scope["route"]` is the domain router's own route, whose path lacks the
    prefix it was included under (`/clusters/{name}`); FastAPI's
    `iter_route_contexts` knows the full one.
    """

    def __init__(self) -> None:
        self._by_route: dict[int, str] | None = None

    def of(self, scope: Scope) -> str:
        route = scope.get("route")
        if route is None:
            return UNMATCHED
        if self._by_route is None:
            self._by_route = {id(c.original_route): c.path_format for c in iter_route_contexts(scope["app"].routes)
                              if c.path_format}
        return self._by_route.get(id(route)) or getattr(route, "path", None) or UNMATCHED


class RequestMetricsMiddleware:
    """Pure ASGI: counts each HTTP request once its status is sent; a stream (SSE) counts when it starts."""

    def __init__(self, app: ASGIApp, metrics: ControlPlaneMetrics) -> None:
        self.app = app
        self.metrics = metrics
        self.templates = RouteTemplates()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status: list[int] = []

        async def observe(message: Message) -> None:
            if message["type"] == "http.response.start" and not status:
                status.append(message["status"])
                route, method = self.templates.of(scope), scope["method"]
                self.metrics.latency.labels(method, route).observe(time.perf_counter() - started)
                self.metrics.requests.labels(method, route, str(message["status"])).inc()
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, observe)
        except BaseException:
            if not status:  # the error handlers answer everything they can; this is a dropped connection
                self.metrics.requests.labels(scope["method"], self.templates.of(scope), "aborted").inc()
            raise
        finally:
            self.metrics.in_flight.dec()


router = APIRouter(tags=["health"])


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
