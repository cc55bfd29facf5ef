"""Recovery strategies side by side: fail_stop, retry_from_scratch, token_commit_resume.

For each kill point k and concurrency c, a victim engine serving c streams
(pinned with X-Lifeline-Prefer-Instance) exits after c·k tokens (engine-wide
count, so ≈ k per stream); a survivor finishes them. Measured per strategy:
success rate, request completion time, recovery gap (last token before the
kill → next token at the client), decode tokens recomputed and prompt tokens
prefilled again (gateway counters), and completion time relative to the same
requests unfaulted.

    .venv/bin/python -m bench.recovery [--preset small] [--kills 32,128,512] [--concurrency 1,8] [--tail N] [--write docs/benchmarks.md]
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

import httpx
from httpx_sse import connect_sse

ROOT = Path(__file__).resolve().parent.parent

from bench.docs import replace_section
from lifeline.processes import EngineProcess, GatewayProcess, built_model, free_port, gateway_config

STRATEGIES = ("fail_stop", "retry_from_scratch", "token_commit_resume")
PROMPT = "Recovery benchmarks compare what each strategy costs when the engine dies"


def one(url: str, max_tokens: int, strategy: str, prefer: str | None) -> dict:
    body = {"model": "bench", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "return_token_ids": True}
    headers = {"X-Lifeline-Recovery": strategy}
    if prefer:
        headers["X-Lifeline-Prefer-Instance"] = prefer
    start = time.perf_counter()
    stamps: list[tuple[float, int]] = []
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
    end = time.perf_counter()
    gap = None
    before = [t for t, e in stamps if e == 0]
    after = [t for t, e in stamps if e > 0]
    if before and after:
        gap = after[0] - before[-1]
    elif after:
        gap = after[0] - start
    return {"ok": ok and len(stamps) == max_tokens, "time": end - start, "gap": gap, "tokens": len(stamps)}


def batch(url: str, c: int, max_tokens: int, strategy: str, prefer: str | None) -> list[dict]:
    with concurrent.futures.ThreadPoolExecutor(c) as pool:
        return list(pool.map(lambda _: one(url, max_tokens, strategy, prefer), range(c)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="small")
    parser.add_argument("--dtype", default="float64")
    parser.add_argument("--kills", default="32,128,512")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--tail", type=int, default=None,
                        help="tokens generated after the kill point (default: k, so the kill lands mid-request)")
    parser.add_argument("--skip", default="", help="k:c pairs to skip, e.g. 512:8,128:8")
    parser.add_argument("--write", type=Path)
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
    survivor = EngineProcess(model, free_port(), "survivor", work / "s-state", work / "survivor.log", extra_args=common)
    survivor.start()
    survivor.wait_ready(timeout=900)
    victims: list[EngineProcess] = []
    skip = {tuple(int(x) for x in pair.split(":")) for pair in args.skip.split(",") if pair}
    rows = []

    def start_victim(exit_after: int | None) -> None:
        for v in victims:
            v.kill()
        previous = gw.leases().get("victim", 0)
        extra = [] if exit_after is None else ["--fault-exit-after-tokens", str(exit_after)]
        v = EngineProcess(model, free_port(), "victim", work / "v-state", work / f"victim-{len(victims)}.log", extra_args=[*common, *extra])
        victims.append(v)
        v.start()
        v.wait_ready(timeout=900)
        gw.wait_generation_above("victim", previous)

    try:
        gw.wait_routable("bench", 1)
        for k in [int(x) for x in args.kills.split(",")]:
            for c in [int(x) for x in args.concurrency.split(",")]:
                if (k, c) in skip:
                    continue
                max_tokens = k + (args.tail if args.tail is not None else k)
                start_victim(None)
                baseline = batch(gw.url, c, max_tokens, "token_commit_resume", "victim")
                base_time = statistics.median(r["time"] for r in baseline)
                for strategy in STRATEGIES:
                    start_victim(c * k)
                    recomputed0 = gw.metric("lifeline_gateway_recomputed_decode_tokens_total")
                    prefill0 = gw.metric("lifeline_gateway_reprefilled_tokens_total")
                    results = batch(gw.url, c, max_tokens, strategy, "victim")
                    ok = [r for r in results if r["ok"]]
                    gaps = [r["gap"] for r in results if r["gap"] is not None]
                    row = {
                        "k": k, "c": c, "strategy": strategy,
                        "success": len(ok) / len(results),
                        "time": statistics.median(r["time"] for r in ok) if ok else None,
                        "gap": statistics.median(gaps) if gaps else None,
                        "recomputed": gw.metric("lifeline_gateway_recomputed_decode_tokens_total") - recomputed0,
                        "reprefilled": gw.metric("lifeline_gateway_reprefilled_tokens_total") - prefill0,
                        "base": base_time,
                    }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        for v in victims:
            v.kill()
        survivor.kill()
        gw.kill()

    table = render(rows, preset=args.preset, dtype=args.dtype, tail=args.tail)
    print(table)
    if args.write:
        replace_section(args.write, "## Recovery strategies (bench/recovery.py)", table)


def render(rows: list[dict], *, preset: str, dtype: str, tail: int | None) -> str:
    """The markdown section: the table, then each (k, streams) judged against the issue's targets."""

    def fmt(x: float | None, unit: str = "", digits: int = 2) -> str:
        return "—" if x is None else f"{x:.{digits}f}{unit}"

    lines = [
        f"Machine: {platform.machine()}, 2 CPUs shared by two engines, the gateway and the client; `{preset}` preset, "
        f"{dtype}, greedy, prompt {len(PROMPT.split())} words, "
        f"{'k' if tail is None else tail} tokens after the kill point (requests of k + that many tokens), one run per cell "
        "(CPU timings on this machine are noisy, ±15%). The victim exits (os._exit, as SIGKILL) when about to send token "
        "c·k+1 engine-wide. Gap: last token before the kill → next token at the client (median over streams). "
        "Inflation: completion time / the same requests unfaulted.",
        "",
        "| k | streams | strategy | success | completion s | recovery gap s | recomputed decode tokens | re-prefilled tokens | inflation |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        inflation = fmt(r["time"] / r["base"], "×") if r["time"] else "—"
        lines.append(f"| {r['k']} | {r['c']} | {r['strategy']} | {r['success']:.0%} | {fmt(r['time'])} | {fmt(r['gap'])} | "
                     f"{r['recomputed']:.0f} | {r['reprefilled']:.0f} | {inflation} |")
    lines += ["", "token_commit_resume against the targets (gap ≤ 20% of retry_from_scratch's, zero recomputed decode "
              "tokens, inflation ≤ 1.10×):", ""]
    cells = {(r["k"], r["c"], r["strategy"]): r for r in rows}
    for (k, c, strategy), r in cells.items():
        retry = cells.get((k, c, "retry_from_scratch"))
        if strategy != "token_commit_resume" or retry is None or not r["gap"] or not retry["gap"] or not r["time"]:
            continue
        ratio, inflation = r["gap"] / retry["gap"], r["time"] / r["base"]
        lines.append(
            f"- k={k}, {c} stream{'s' if c > 1 else ''}: gap {ratio:.0%} of retry_from_scratch's "
            f"({'met' if ratio <= 0.20 else 'missed'}); recomputed {r['recomputed']:.0f} "
            f"({'met' if r['recomputed'] == 0 else 'missed'}); inflation {inflation:.2f}× "
            f"({'met' if inflation <= 1.10 else 'missed'})"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
