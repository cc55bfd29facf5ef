"""Gateway overhead: the same streams direct to an engine and through the gateway.

Measures time to first token, inter-token latency (p50/p99 over every gap of
every stream) and aggregate tokens/s at 1 and 32 concurrent streams, greedy,
`tiny` preset (fast enough that a fraction of a millisecond shows). Gateway
and engine share this machine's CPUs, so the gateway's own CPU time is taken
from the engine: on 2 cores that is the dominant cost, not network hops.

LiteLLM's proxy as a third column is not measured here (it needs its own
virtualenv; see docs/benchmarks.md).

    .venv/bin/python bench/gateway_overhead.py [--streams 1,32] [--tokens 64] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from httpx_sse import connect_sse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.docs import replace_section  # noqa: E402
from tests.conftest import built_model, free_port  # noqa: E402
from tests.support.engine_process import EngineProcess  # noqa: E402
from tests.support.gateway_process import GatewayProcess, gateway_config  # noqa: E402

PROMPT = "Gateways add latency only where they must"


def one_stream(url: str, model: str, max_tokens: int) -> tuple[float, list[float], int, float]:
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    start = time.perf_counter()
    stamps: list[float] = []
    with httpx.Client(timeout=600) as client, connect_sse(client, "POST", f"{url}/v1/completions", json=body) as source:
        for event in source.iter_sse():
            if event.data == "[DONE]":
                break
            stamps.append(time.perf_counter())
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return stamps[0] - start, gaps, len(stamps), stamps[-1] - start


def run(url: str, model: str, streams: int, max_tokens: int) -> dict:
    one_stream(url, model, 4)  # warm the connection pool and the engine
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        results = list(pool.map(lambda _: one_stream(url, model, max_tokens), range(streams)))
    wall = time.perf_counter() - start
    ttfts = [r[0] for r in results]
    gaps = sorted(g for r in results for g in r[1])
    tokens = sum(r[2] for r in results)
    return {
        "ttft_p50_ms": statistics.median(ttfts) * 1000,
        "itl_p50_ms": statistics.median(gaps) * 1000,
        "itl_p99_ms": gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))] * 1000,
        "tokens_per_s": tokens / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", default="1,32")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="alternate direct/gateway this many times; best run kept")
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    model = built_model("tiny", 0)
    work = Path(tempfile.mkdtemp(prefix="bench-gw-"))
    gw = GatewayProcess(gateway_config(model, admission={"max_concurrency_per_engine": 64, "max_queue": 64}), free_port(), work)
    gw.start()
    gw.wait_live()
    engine = EngineProcess(model, free_port(), "bench-eng", work / "state", work / "engine.log", extra_args=gw.registry_args())
    engine.start()
    rows = []
    try:
        engine.wait_ready()
        gw.wait_routable("tiny", 1)
        for streams in [int(s) for s in args.streams.split(",")]:
            best: dict[str, dict] = {}
            for _ in range(args.repeats):
                for label, url, name in (("direct", engine.url, model.name), ("gateway", gw.url, "tiny")):
                    result = run(url, name, streams, args.tokens)
                    if label not in best or result["tokens_per_s"] > best[label]["tokens_per_s"]:
                        best[label] = result
            for label in ("direct", "gateway"):
                rows.append({"path": label, "streams": streams, **best[label]})
                print(label, streams, best[label], flush=True)
            d, g = best["direct"], best["gateway"]
            rows.append({"path": "gateway − direct", "streams": streams, "ttft_p50_ms": g["ttft_p50_ms"] - d["ttft_p50_ms"],
                         "itl_p50_ms": g["itl_p50_ms"] - d["itl_p50_ms"], "itl_p99_ms": g["itl_p99_ms"] - d["itl_p99_ms"],
                         "tokens_per_s": g["tokens_per_s"] / d["tokens_per_s"], "ratio": True})
    finally:
        engine.kill()
        gw.kill()
    lines = [
        f"Machine: {platform.machine()}, {len(__import__('os').sched_getaffinity(0))} CPUs shared by engine, gateway and client; "
        f"`tiny` preset, float64, greedy, {args.tokens} tokens per stream, best of {args.repeats} alternating runs. "
        "LiteLLM proxy: not measured (time; it needs its own venv).",
        "",
        "| path | streams | TTFT p50 ms | ITL p50 ms | ITL p99 ms | tokens/s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        tps = f"{r['tokens_per_s']:.2f}× of direct" if r.get("ratio") else f"{r['tokens_per_s']:.1f}"
        lines.append(f"| {r['path']} | {r['streams']} | {r['ttft_p50_ms']:.2f} | {r['itl_p50_ms']:.2f} | {r['itl_p99_ms']:.2f} | {tps} |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        replace_section(args.write, "## Gateway overhead (bench/gateway_overhead.py)", table)


if __name__ == "__main__":
    main()
