"""Recovery strategies side by side: fail_stop, retry_from_scratch, token_commit_resume, and
token_commit_resume with KV checkpoints (engines share a checkpoint store; the survivor imports).

For each kill point k and concurrency c, a victim engine serving c streams
(pinned with X-Lifeline-Prefer-Instance) exits after c·k tokens (engine-wide
count, so ≈ k per stream); a survivor finishes them. Measured per strategy:
success rate, request completion time, recovery gap (last token before the
kill → next token at the client), decode tokens recomputed and prompt tokens
prefilled again (gateway counters), and completion time relative to the same
requests unfaulted.

    .venv/bin/python -m bench.recovery [--preset small] [--kills 32,128,512] [--concurrency 1,8] [--runs 3]
        [--checkpoint-every 16] [--tail N] [--write docs/benchmarks.md]   (CSV and PNG beside it)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from httpx_sse import connect_sse

ROOT = Path(__file__).resolve().parent.parent

from bench.docs import replace_section
from lifeline.processes import EngineProcess, GatewayProcess, built_model, free_port, gateway_config, scrape_metric

@dataclass(frozen=True)
class Strategy:
    """A column: the gateway's recovery strategy, and whether engines checkpoint KV to a shared store."""

    name: str
    gateway: str  # X-Lifeline-Recovery
    checkpoints: bool = False


STRATEGIES = (
    Strategy("fail_stop", "fail_stop"),
    Strategy("retry_from_scratch", "retry_from_scratch"),
    Strategy("token_commit_resume", "token_commit_resume"),
    Strategy("token_commit_resume+kv_checkpoints", "token_commit_resume", checkpoints=True),
)
PROMPT = "Recovery benchmarks compare what each strategy costs when the engine dies"


def prompt_for(stream: int) -> str:
    """A prompt per stream: identical streams would share KV blocks in the survivor's prefix cache, which
    flatters any strategy that re-prefills (real streams have distinct prompts)."""
    return f"Stream {stream}. {PROMPT}"


def one(url: str, stream: int, max_tokens: int, strategy: str, prefer: str | None) -> dict:
    body = {"model": "bench", "prompt": prompt_for(stream), "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "return_token_ids": True}
    headers = {"X-Lifeline-Recovery": strategy}
    if prefer:
        headers["X-Lifeline-Prefer-Instance"] = prefer
    start = time.perf_counter()
    stamps: list[tuple[float, int]] = []
    tokens: list[int] = []
    ok = False
    with httpx.Client(timeout=900) as client, connect_sse(client, "POST", f"{url}/v1/completions", json=body, headers=headers) as source:
        for event in source.iter_sse():
            if event.data == "[DONE]":
                ok = True
                break
            if event.event == "error":
                break
            chunk = json.loads(event.data)
            if chunk["choices"] and chunk["choices"][0].get("token_ids"):
                stamps.append((time.perf_counter(), chunk["lifeline"]["epoch"]))
                tokens.extend(chunk["choices"][0]["token_ids"])
    end = time.perf_counter()
    gap = None
    before = [t for t, e in stamps if e == 0]
    after = [t for t, e in stamps if e > 0]
    if before and after:
        gap = after[0] - before[-1]
    elif after:
        gap = after[0] - start
    return {"ok": ok and len(tokens) == max_tokens, "time": end - start, "gap": gap, "tokens": tokens}


def batch(url: str, c: int, max_tokens: int, strategy: str, prefer: str | None) -> list[dict]:
    with concurrent.futures.ThreadPoolExecutor(c) as pool:
        return list(pool.map(lambda i: one(url, i, max_tokens, strategy, prefer), range(c)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="small")
    parser.add_argument("--dtype", default="float64")
    parser.add_argument("--kills", default="32,128,512")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--runs", type=int, default=3, help="runs per cell; the table shows the median and range")
    parser.add_argument("--checkpoint-every", type=int, default=16, help="the KV checkpoint column's M")
    parser.add_argument("--tail", type=int, default=None,
                        help="tokens generated after the kill point (default: k, so the kill lands mid-request)")
    parser.add_argument("--skip", default="", help="k:c pairs to skip, e.g. 512:8,128:8")
    parser.add_argument("--write", type=Path, help="docs/benchmarks.md: the section, plus a CSV and a PNG beside it")
    args = parser.parse_args()
    model = built_model(args.preset, 0)
    work = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
    config = gateway_config(model, alias="bench", recovery={"stall_timeout": 30.0, "first_token_timeout": 600.0,
                                                             "request_timeout": 3600.0},
                            admission={"max_concurrency_per_engine": 16, "max_queue": 16, "retry_budget_min": 16})
    gw = GatewayProcess(config, free_port(), work)
    gw.start()
    gw.wait_live()
    common = [*gw.registry_args(), "--dtype", args.dtype, "--torch-threads", "2"]
    engines: dict[str, list[EngineProcess]] = {"victim": [], "survivor": []}
    skip = {tuple(int(x) for x in pair.split(":")) for pair in args.skip.split(",") if pair}
    samples = []

    def kv_args(store: Path | None) -> list[str]:
        """No store: no prefix cache either, as engines ran before KV blocks existed without a holder."""
        if store is None:
            return ["--kv-cache-blocks", "0"]
        return ["--kv-checkpoint-store", str(store), "--kv-checkpoint-every", str(args.checkpoint_every)]

    def start(role: str, extra: list[str]) -> EngineProcess:
        for old in engines[role]:
            old.kill()
        previous = gw.leases().get(role, 0)
        engine = EngineProcess(model, free_port(), role, work / f"{role}-state",
                               work / f"{role}-{len(engines[role])}.log", extra_args=[*common, *extra])
        engines[role].append(engine)
        engine.start()
        engine.wait_ready(timeout=900)
        gw.wait_generation_above(role, previous)
        return engine

    try:
        survivor = start("survivor", kv_args(None))
        survivor_store: Path | None = None
        gw.wait_routable("bench", 1)
        for run in range(args.runs):
            for k in [int(x) for x in args.kills.split(",")]:
                for c in [int(x) for x in args.concurrency.split(",")]:
                    if (k, c) in skip:
                        continue
                    max_tokens = k + (args.tail if args.tail is not None else k)
                    start("victim", kv_args(None))
                    baseline = batch(gw.url, c, max_tokens, "token_commit_resume", "victim")
                    base_time = statistics.median(r["time"] for r in baseline)
                    expected = [r["tokens"] for r in baseline]
                    for strategy in STRATEGIES:
                        store = work / f"kv-store-{run}-{k}-{c}" if strategy.checkpoints else None
                        if store != survivor_store:  # a fresh store per cell: nothing left from an earlier run
                            survivor, survivor_store = start("survivor", kv_args(store)), store
                        start("victim", [*kv_args(store), "--fault-exit-after-tokens", str(c * k)])
                        recomputed0 = gw.metric("lifeline_gateway_recomputed_decode_tokens_total")
                        prefill0 = gw.metric("lifeline_gateway_reprefilled_tokens_total")
                        survivor_prefilled0 = scrape_metric(f"{survivor.url}/metrics", "vllm:prompt_tokens_total")
                        imported0 = scrape_metric(f"{survivor.url}/metrics", "lifeline_engine_kv_imported_tokens_total")
                        results = batch(gw.url, c, max_tokens, strategy.gateway, "victim")
                        ok = [r for r in results if r["ok"]]
                        gaps = [r["gap"] for r in results if r["gap"] is not None]
                        sample = {
                            "run": run, "k": k, "c": c, "strategy": strategy.name,
                            "success": len(ok) / len(results),
                            "identical": all(r["tokens"] == e for r, e in zip(results, expected, strict=True)
                                             if r["ok"]) if ok else None,
                            "time": statistics.median(r["time"] for r in ok) if ok else None,
                            "gap": statistics.median(gaps) if gaps else None,
                            "recomputed": gw.metric("lifeline_gateway_recomputed_decode_tokens_total") - recomputed0,
                            "reprefilled": gw.metric("lifeline_gateway_reprefilled_tokens_total") - prefill0,
                            "survivor_prefilled": scrape_metric(f"{survivor.url}/metrics", "vllm:prompt_tokens_total")
                            - survivor_prefilled0,
                            "imported": scrape_metric(f"{survivor.url}/metrics",
                                                      "lifeline_engine_kv_imported_tokens_total") - imported0,
                            "base": base_time,
                        }
                        sample["inflation"] = sample["time"] / base_time if sample["time"] else None
                        samples.append(sample)
                        print(json.dumps(sample), flush=True)
    finally:
        for role in engines.values():
            for engine in role:
                engine.kill()
        gw.kill()

    rows = aggregate(samples)
    table = render(rows, preset=args.preset, dtype=args.dtype, tail=args.tail, runs=args.runs,
                   every=args.checkpoint_every)
    print(table)
    if args.write:
        csv_path = args.write.with_name("benchmarks-recovery.csv")
        png_path = args.write.with_name("benchmarks-recovery.png")
        write_csv(csv_path, samples)
        plot(png_path, rows)
        replace_section(args.write, "## Recovery strategies (bench/recovery.py)",
                        table + f"\n\nEvery run: [`{csv_path.name}`]({csv_path.name}). "
                                f"Plot: ![inflation and gap per strategy]({png_path.name})")


FIELDS = ("success", "time", "gap", "recomputed", "reprefilled", "survivor_prefilled", "imported", "inflation")


def aggregate(samples: list[dict]) -> list[dict]:
    """One row per (k, streams, strategy): per field the median and the range over runs."""
    cells: dict[tuple, list[dict]] = {}
    for sample in samples:
        cells.setdefault((sample["k"], sample["c"], sample["strategy"]), []).append(sample)
    rows = []
    for (k, c, strategy), runs in cells.items():
        judged = [r["identical"] for r in runs if r["identical"] is not None]
        row: dict = {"k": k, "c": c, "strategy": strategy, "runs": len(runs),
                     "identical": all(judged) if judged else None}
        for name in FIELDS:
            values = [r[name] for r in runs if r[name] is not None]
            row[name] = (statistics.median(values), min(values), max(values)) if values else None
        rows.append(row)
    return rows


def write_csv(path: Path, samples: list[dict]) -> None:
    import csv

    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=["run", "k", "c", "strategy", "identical", *FIELDS, "base"])
        writer.writeheader()
        writer.writerows(samples)


def plot(path: Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r["strategy"] != "fail_stop" and r["inflation"]]
    cells = sorted({(r["k"], r["c"]) for r in shown})
    names = [s.name for s in STRATEGIES if s.name != "fail_stop"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(names)
    for offset, name in enumerate(names):
        for axis, field in zip(axes, ("inflation", "gap"), strict=True):
            xs, ys, lo, hi = [], [], [], []
            for i, cell in enumerate(cells):
                row = next((r for r in shown if (r["k"], r["c"]) == cell and r["strategy"] == name), None)
                if row is None or row[field] is None:
                    continue
                median, low, high = row[field]
                xs.append(i + offset * width)
                ys.append(median)
                lo.append(median - low)
                hi.append(high - median)
            axis.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=name)
    for axis, title in zip(axes, ("failure-induced inflation (×)", "recovery gap (s)"), strict=True):
        axis.set_xticks([i + 0.4 - width / 2 for i in range(len(cells))], [f"k={k}, {c} streams" for k, c in cells])
        axis.set_title(title + ": median, bars = range")
    axes[0].axhline(1.10, color="grey", linestyle="--", linewidth=0.8)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def render(rows: list[dict], *, preset: str, dtype: str, tail: int | None, runs: int, every: int) -> str:
    """The markdown section: the table (median [min–max] over runs), then each cell judged against the targets."""

    def fmt(cell: tuple | None, unit: str = "", digits: int = 2) -> str:
        if cell is None:
            return "—"
        median, low, high = cell
        if low == high:
            return f"{median:.{digits}f}{unit}"
        return f"{median:.{digits}f}{unit} [{low:.{digits}f}–{high:.{digits}f}]"

    lines = [
        f"Machine: {platform.machine()}, 2 CPUs shared by two engines, the gateway, the client and other sessions' "
        f"work; `{preset}` preset, {dtype}, greedy, one prompt per stream (`Stream i. …`, {len(prompt_for(0).split())} "
        f"words), {'k' if tail is None else tail} tokens after the kill point (requests of k + that many tokens). "
        f"Each cell: the median of {runs} runs, [min–max] beside it. The victim exits (os._exit, as SIGKILL) when about "
        "to send token c·k+1 engine-wide. Gap: last token before the kill → next token at the client (median over "
        "streams). Inflation: completion time / the same requests unfaulted in the same run. Re-prefilled: the "
        "gateway's count of continuation prompt tokens; prefilled at the survivor and imported: the survivor's own "
        f"counters. The kv_checkpoints column: victim and survivor share a filesystem checkpoint store (a fresh one "
        f"per cell), checkpoint every {every} tokens; the other columns run without a prefix cache "
        "(`--kv-cache-blocks 0`), as before KV blocks existed.",
        "",
        "| k | streams | strategy | success | completion s | recovery gap s | recomputed decode | re-prefilled "
        "(gateway) | prefilled at survivor | imported | inflation | tokens = unfaulted |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['k']} | {r['c']} | {r['strategy']} | {fmt(r['success'], digits=2)} | {fmt(r['time'])} | "
            f"{fmt(r['gap'])} | {fmt(r['recomputed'], digits=0)} | {fmt(r['reprefilled'], digits=0)} | "
            f"{fmt(r['survivor_prefilled'], digits=0)} | {fmt(r['imported'], digits=0)} | {fmt(r['inflation'], '×')} | "
            f"{'—' if r['identical'] is None else 'yes' if r['identical'] else 'NO'} |")
    lines += ["", "Against the targets (token_commit_resume: gap ≤ 20% of retry_from_scratch's, inflation ≤ 1.10×; "
              "with KV checkpoints: gap ≤ 10% of retry_from_scratch's, inflation ≤ 1.10×), on medians:", ""]
    cells = {(r["k"], r["c"], r["strategy"]): r for r in rows}
    for (k, c, strategy), r in cells.items():
        retry = cells.get((k, c, "retry_from_scratch"))
        if not strategy.startswith("token_commit_resume") or retry is None or not r["gap"] or not retry["gap"] \
                or not r["inflation"]:
            continue
        bound = 0.10 if strategy.endswith("kv_checkpoints") else 0.20
        ratio, inflation = r["gap"][0] / retry["gap"][0], r["inflation"][0]
        lines.append(
            f"- k={k}, {c} stream{'s' if c > 1 else ''}, {strategy}: gap {ratio:.0%} of retry_from_scratch's "
            f"({'met' if ratio <= bound else 'missed'}); inflation {inflation:.2f}× "
            f"({'met' if inflation <= 1.10 else 'missed'})")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
