"""OpenTelemetry spans of a stream and of each engine attempt: one trace per request, however often it moves.

    gateway stream      (SERVER)  the client's request, from the first engine to the last frame; a child of the
                                  client's own span when it sends W3C `traceparent`; attributes: request id,
                                  model, version, strategy, outcome, migrations
      engine attempt    (CLIENT)  one per engine tried, in order: instance, generation, epoch, attempt id; a
                                  failed one ends with status ERROR and `lifeline.failure` (the migration's
                                  reason: lease_lapsed, stall, engine_exit, abort, …)

Each attempt's span goes to its engine as `traceparent` (the reference
engine logs its trace id; vLLM, per its docs, continues it when started with
`--otlp-traces-endpoint`, not exercised here), so one trace holds the
client's request and both engine attempts of a migrated stream. Exported by
OTLP over HTTP in batches.

Off by default (`tracing.enabled`), and off costs nothing: no tracer is
built, and each hook returns at its first line. A stream a replica takes over
from another's token log starts a new trace (the first replica's context is
not in the log).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from gateway.router import Endpoint
    from gateway.settings import TracingConfig
    from gateway.stream_request import StreamRequest


class Tracing:
    """The gateway's tracer, or none (tracing off): every method is then a no-op returning None."""

    def __init__(self, config: TracingConfig | None = None, *, replica_id: str = "gateway-0") -> None:
        self._provider: Any = None
        self._tracer: Any = None
        if config is None or not config.enabled:
            return
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        self._provider = TracerProvider(
            resource=Resource.create({"service.name": config.service_name, "service.instance.id": replica_id}),
            sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)))
        self._provider.add_span_processor(BatchSpanProcessor(
            OTLPSpanExporter(endpoint=config.otlp_endpoint, timeout=config.export_timeout.total_seconds()),
            schedule_delay_millis=config.export_interval.total_seconds() * 1000))
        self._tracer = self._provider.get_tracer("lifeline.gateway")

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def stream_span(self, request: StreamRequest, headers: Mapping[str, str] | None = None) -> Span | None:
        if self._tracer is None:
            return None
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        parent = TraceContextTextMapPropagator().extract(carrier=dict(headers or {}))
        return self._tracer.start_span("gateway stream", context=parent, kind=SpanKind.SERVER, attributes={
            "lifeline.request_id": request.request_id, "lifeline.model": request.model,
            "lifeline.version": request.version, "lifeline.strategy": request.strategy.value})

    def attempt_span(self, stream: Span | None, endpoint: Endpoint, *, epoch: int, attempt_id: str) -> Span | None:
        if self._tracer is None or stream is None:
            return None
        from opentelemetry.trace import SpanKind, set_span_in_context

        return self._tracer.start_span("engine attempt", context=set_span_in_context(stream), kind=SpanKind.CLIENT,
                                       attributes={"lifeline.instance": endpoint.instance_id,
                                                   "lifeline.generation": endpoint.generation,
                                                   "lifeline.epoch": epoch, "lifeline.attempt_id": attempt_id,
                                                   "server.address": endpoint.url})

    @staticmethod
    def traceparent(span: Span | None) -> str | None:
        """The W3C `traceparent` of `span`, for the engine request it stands for."""
        if span is None:
            return None
        from opentelemetry.trace import set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier, context=set_span_in_context(span))
        return carrier.get("traceparent")

    @staticmethod
    def end(span: Span | None, *, failure: str | None = None, **attributes: str | int) -> None:
        if span is None:
            return
        from opentelemetry.trace import Status, StatusCode

        for key, value in attributes.items():
            span.set_attribute(f"lifeline.{key}", value)
        if failure is not None:
            span.set_attribute("lifeline.failure", failure)
            span.set_status(Status(StatusCode.ERROR, failure))
        span.end()

    def shutdown(self) -> None:
        """Export what is still buffered, then stop (the gateway's shutdown)."""
        if self._provider is not None:
            self._provider.shutdown()
