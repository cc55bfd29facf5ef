"""The steady-state cost of KV blocks and checkpoints: decode throughput with them on and off, no failure.

Issue 12's target: checkpointing costs at most 1% of engine throughput (DéjàVu reports ≤ 2%). One
engine at a time serves `--streams` concurrent greedy requests (one prompt each) of `--tokens`
tokens; throughput is generated tokens / wall time of the batch. Configurations, run in turn
(off, cache, …, off, cache, …) so drift on a shared machine spreads over all of them:

    off            --kv-cache-blocks 0: no prefix cache, no checkpoints (the engine before issue 12)
    cache          the in-process prefix cache only (the default)
    checkpoint/M   cache + a filesystem checkpoint store, a checkpoint every M generated tokens

    .venv/bin/python -m bench.kv_checkpoint_cost [--preset small] [--streams 8] [--tokens 128] [--runs 3]
        [--every 64,16] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

from bench.docs import replace_section
from common import oneshot_http
from lifeline.processes import EngineProcess, built_model, free_port, scrape_metric

PROMPT = "Steady-state decoding with checkpoints of its KV blocks written to a regional store"
HEADING = "## KV checkpoint cost (bench/kv_checkpoint_cost.py)"


def batch(url: str, streams: int, tokens: int) -> float:
    """Generated tokens per second over one batch of concurrent requests."""

    def one(i: int) -> int:
        body = {"prompt": f"Stream {i}. {PROMPT}", "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
        response = oneshot_http.post(f"{url}/v1/completions", json=body, timeout=900)
        response.raise_for_status()
        return response.json()["usage"]["completion_tokens"]

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        generated = sum(pool.map(one, range(streams)))
    return generated / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="small")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--every", default="64,16", help="checkpoint intervals to measure, in generated tokens")
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    model = built_model(args.preset, 0)
    work = Path(tempfile.mkdtemp(prefix="bench-kv-cost-"))
    configs: dict[str, list[str]] = {"off": ["--kv-cache-blocks", "0"], "cache": []}
    intervals = [int(x) for x in args.every.split(",") if x]
    for every in intervals:
        configs[f"checkpoint/{every}"] = ["--kv-checkpoint-every", str(every)]
    samples: dict[str, list[float]] = {name: [] for name in configs}
    shares: dict[str, list[tuple[float, ...]]] = {name: [] for name in configs}
    written: dict[str, float] = {}
    for run in range(args.runs):
        for name, extra in configs.items():
            if name.startswith("checkpoint/"):  # a fresh store each run: blocks are content-addressed
                extra = [*extra, "--kv-checkpoint-store", str(work / f"store-{run}-{name.replace('/', '-')}")]
            engine = EngineProcess(model, free_port(), f"cost-{run}-{name.replace('/', '-')}", work / "state",
                                   work / f"{run}-{name.replace('/', '-')}.log",
                                   extra_args=["--torch-threads", "2", "--max-num-seqs", str(args.streams), *extra])
            engine.start()
            try:
                engine.wait_ready(timeout=900)
                batch(engine.url, 1, 4)  # warm up
                metrics = f"{engine.url}/metrics"
                before = read_seconds(metrics)
                started = time.perf_counter()
                rate = batch(engine.url, args.streams, args.tokens)
                wall = time.perf_counter() - started
                after = read_seconds(metrics)
                shares[name].append(tuple((a - b) / wall for a, b in zip(after, before, strict=True)))
                written[name] = scrape_metric(metrics, "lifeline_engine_kv_checkpoint_blocks_total")
            finally:
                engine.kill()
            samples[name].append(rate)
            print(json.dumps({"run": run, "config": name, "tokens_per_s": rate, "shares": shares[name][-1]}),
                  flush=True)
    table = render(samples, shares, written, args)
    print(table)
    if args.write:
        replace_section(args.write, HEADING, table)


def read_seconds(metrics: str) -> list[float]:
    """Decode-thread publish and checkpoint seconds, writer wall and CPU seconds, as the engine counts them."""
    return [*(scrape_metric(metrics, "lifeline_engine_kv_decode_thread_seconds_total", {"work": w})
              for w in ("publish", "checkpoint")),
            scrape_metric(metrics, "lifeline_engine_kv_checkpoint_write_seconds_total"),
            scrape_metric(metrics, "lifeline_engine_kv_checkpoint_write_cpu_seconds_total")]


def render(samples: dict[str, list[float]], shares: dict[str, list[tuple[float, ...]]],
           written: dict[str, float], args: argparse.Namespace) -> str:
    base = statistics.median(samples["off"])

    def share(name: str, index: int) -> str:
        values = [s[index] for s in shares[name]]
        return f"{statistics.median(values):.2%} [{min(values):.2%}–{max(values):.2%}]"

    lines = [
        f"Machine: {platform.machine()}, 2 CPUs shared with other sessions' work; `{args.preset}` preset, float64, "
        f"{args.streams} concurrent greedy requests of {args.tokens} tokens, one prompt each, one engine at a time "
        f"(`--torch-threads 2`); configurations interleaved, {args.runs} runs each: median [min–max]. "
        "Shares: seconds spent on KV blocks (the engine's own counters) / the batch's wall time. The decode thread is "
        "busy for all of it, so its share is what decoding gave up; the writer's wall time includes waiting on the "
        "store (fsync), its CPU time is what it took from the cores.",
        "",
        "| configuration | tokens/s | vs off | decode thread: publish | decode thread: checkpoint | writer wall | "
        "writer CPU | blocks written (last run) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, rates in samples.items():
        median = statistics.median(rates)
        lines.append(f"| {name} | {median:.1f} [{min(rates):.1f}–{max(rates):.1f}] | {median / base - 1:+.1%} | "
                     f"{share(name, 0)} | {share(name, 1)} | {share(name, 2)} | {share(name, 3)} | "
                     f"{written.get(name, 0):.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
