"""An OTLP/HTTP traces endpoint for tests: what a collector is sent, decoded with opentelemetry-proto.

The gateway (its OpenTelemetry SDK) and stock vLLM (`--otlp-traces-endpoint`, with
`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`) export to it as they would to a collector.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from lifeline.processes import free_port


class TraceReceiver:
    """Every span it was sent, as a dict: name, trace_id, span_id, parent (hex), status code, attributes."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        self.spans: list[dict[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                request = ExportTraceServiceRequest()
                request.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
                for resource in request.resource_spans:
                    service = {a.key: _value(a.value) for a in resource.resource.attributes}.get("service.name")
                    for scope in resource.scope_spans:
                        for span in scope.spans:
                            receiver.spans.append({
                                "name": span.name, "service": service, "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(), "parent": span.parent_span_id.hex(),
                                "status": span.status.code,
                                "attributes": {a.key: _value(a.value) for a in span.attributes}})
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def in_trace(self, trace_id: str) -> list[dict[str, Any]]:
        return [span for span in self.spans if span["trace_id"] == trace_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None
