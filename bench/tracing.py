"""What the gateway's traces cost: the same streams through a gateway with tracing off and one with it on.

Two gateway processes in front of one reference engine (registry: the first
gateway's; the second declares the engine), same prompt, `max_tokens` and
`ignore_eos`, every stream checked to end by `length`. Tracing on exports
every span by OTLP/HTTP to a sink in this process that reads and discards
them (a collector's work is not the gateway's). Reported per path: the
gateway process's own CPU time per token (user + system, /proc: what tracing
adds, and what barely moves with other load on the machine), TTFT and ITL;
then on − off, the median of back-to-back pairs, the order rotated between
repeats. Off is the default: a gateway with `tracing.enabled: false` builds
no tracer, so "off" here is every deployment that does not ask for traces.

    .venv/bin/python -m bench.tracing [--streams 1,32] [--tokens 64] [--repeats 5] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from bench.docs import replace_section
from bench.gateway_overhead import Target, run
from lifeline.processes import EngineProcess, GatewayProcess, built_model, free_port, gateway_config

SECTION = "## Gateway traces: what tracing costs (bench/tracing.py)"
METRICS = ("proxy_cpu_us", "ttft_p50_ms", "itl_p50_ms", "itl_p99_ms")


class Sink(BaseHTTPRequestHandler):
    spans_bytes = 0

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        Sink.spans_bytes += len(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", default="1,32")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--min-gaps", type=int, default=1000)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    model = built_model("tiny", 0)
    work = Path(tempfile.mkdtemp(prefix="bench-tracing-"))
    sink = ThreadingHTTPServer(("127.0.0.1", free_port()), Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    admission = {"max_concurrency_per_engine": 64, "max_queue": 64}
    off = GatewayProcess(gateway_config(model, admission=admission), free_port(), work, replica_id="gw-off")
    off.start()
    off.wait_live()
    engine = EngineProcess(model, free_port(), "bench-eng", work / "state", work / "engine.log",
                           extra_args=off.registry_args())
    engine.start()
    engine.wait_ready()
    on = GatewayProcess(gateway_config(model, admission=admission, registry={"require_lease": False}, engines=[
        {"instance_id": "bench-eng", "url": engine.url, "version": model.name}], tracing={
        "enabled": True, "otlp_endpoint": f"http://127.0.0.1:{sink.server_address[1]}/v1/traces",
        "export_interval": 1.0}), free_port(), work, replica_id="gw-on")
    on.start()
    on.wait_live()
    rows: list[dict] = []
    load_before = os.getloadavg()[0]
    try:
        off.wait_routable("tiny", 1)
        paths = [Target("tracing off", off.url, "tiny", pid=off.process.pid),
                 Target("tracing on", on.url, "tiny", pid=on.process.pid)]
        for streams in [int(s) for s in args.streams.split(",")]:
            for path in paths:
                run(path, streams, 8, min_gaps=0)  # warm-up: pools, the engine, the exporter's first batch
            runs: dict[str, list[dict]] = {path.label: [] for path in paths}
            for repeat in range(args.repeats):
                for path in (paths if repeat % 2 == 0 else paths[::-1]):
                    runs[path.label].append(run(path, streams, args.tokens, min_gaps=args.min_gaps))
                    print(path.label, streams, runs[path.label][-1], flush=True)
            for path in paths:
                rows.append({"path": path.label, "streams": streams, "gaps": runs[path.label][0]["gaps"],
                             **{m: statistics.median(r[m] for r in runs[path.label]) for m in METRICS}})
            pairs = list(zip(runs["tracing on"], runs["tracing off"], strict=True))
            rows.append({"path": "on − off", "streams": streams, "gaps": runs["tracing on"][0]["gaps"],
                         **{m: statistics.median(a[m] - b[m] for a, b in pairs) for m in METRICS},
                         "range": (min(a["proxy_cpu_us"] - b["proxy_cpu_us"] for a, b in pairs),
                                   max(a["proxy_cpu_us"] - b["proxy_cpu_us"] for a, b in pairs))})
    finally:
        engine.kill()
        on.kill()
        off.kill()
        sink.shutdown()
    lines = [
        f"Machine: {platform.machine()}, {len(os.sched_getaffinity(0))} CPUs shared by the engine, both gateways "
        f"and the client (1-minute load average {load_before:.2f} before the run); `tiny` preset, greedy, "
        f"{args.tokens} tokens per stream, ≥ {args.min_gaps} gaps per run, medians of {args.repeats} runs per path, "
        f"the order alternating; on − off: medians of back-to-back pairs, the pairs' range in brackets. Spans "
        f"exported to a sink in the bench process: {Sink.spans_bytes / 1024:.0f} KiB of OTLP protobuf.",
        "",
        "| path | streams | gateway CPU µs/token | TTFT p50 ms | ITL p50 ms | ITL p99 ms | gaps |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cpu = f"{r['proxy_cpu_us']:.0f}"
        if "range" in r:
            cpu = f"{r['proxy_cpu_us']:+.0f} [{r['range'][0]:+.0f}, {r['range'][1]:+.0f}]"
        lines.append(f"| {r['path']} | {r['streams']} | {cpu} | {r['ttft_p50_ms']:.2f} | {r['itl_p50_ms']:.2f} | "
                     f"{r['itl_p99_ms']:.2f} | {r['gaps']} |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        replace_section(args.write, SECTION, table)


if __name__ == "__main__":
    main()
