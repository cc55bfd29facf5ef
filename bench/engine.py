"""Reference-engine benchmark: decode speed, time to first token, prefill cost.

Runs real `lifeline engine serve` processes over HTTP for the `tiny` and
`small` presets at 1 and 8 concurrent streams, and times prefill of 128,
512 and 2048-token prompts in-process against transformers' LlamaForCausalLM
forward on the same weights (the baseline, measured in the same run).
Prefill time is the number later recovery benchmarks are judged against:
it is what token-commit-resume pays to re-prefill `prompt ‖ committed`.

    .venv/bin/python -m bench.engine [--presets tiny,small] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import platform
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import torch
from httpx_sse import connect_sse

ROOT = Path(__file__).resolve().parent.parent

from bench.docs import replace_section
from lifeline.processes import EngineProcess, built_model, free_port


def stream_once(url: str, model: str, prompt: str, max_tokens: int) -> tuple[float, float, int]:
    """Return (ttft_s, total_s, tokens) for one streamed greedy completion."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    start = time.perf_counter()
    first = None
    tokens = 0
    with httpx.Client(timeout=600) as client, connect_sse(client, "POST", f"{url}/v1/completions", json=body) as source:
        for event in source.iter_sse():
            if event.data == "[DONE]":
                break
            tokens += 1
            if first is None:
                first = time.perf_counter() - start
    return first or 0.0, time.perf_counter() - start, tokens


def bench_serving(model_dir: Path, dtype: str, max_tokens: int, workdir: Path) -> list[dict]:
    engine = EngineProcess(model=model_dir, port=free_port(), instance_id=f"bench-{model_dir.name}-{dtype}",
                           state_dir=workdir / "state", log_path=workdir / f"{model_dir.name}-{dtype}.log",
                           extra_args=["--dtype", dtype, "--torch-threads", str(torch.get_num_threads())])
    engine.start()
    rows = []
    try:
        engine.wait_ready(timeout=600)
        stream_once(engine.url, model_dir.name, "warm up", 4)
        for concurrency in (1, 8):
            prompts = [f"Stream {i} recovers the primary region after a zone loss" for i in range(concurrency)]
            start = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
                results = list(pool.map(lambda p: stream_once(engine.url, model_dir.name, p, max_tokens), prompts))
            wall = time.perf_counter() - start
            tokens = sum(r[2] for r in results)
            rows.append({
                "model": model_dir.name.split("-")[0], "dtype": dtype, "streams": concurrency,
                "tokens_per_s": tokens / wall,
                "per_stream_tokens_per_s": statistics.mean(r[2] / (r[1] - r[0]) for r in results),
                "ttft_ms": statistics.median(r[0] for r in results) * 1000,
            })
    finally:
        engine.kill()
    return rows


def bench_prefill(model_dir: Path, lengths: list[int]) -> list[dict]:
    from transformers import LlamaForCausalLM

    from engine.model import LlamaModel

    rows = []
    reference = LlamaForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    for dtype in (torch.float64, torch.float32):
        ours = LlamaModel.load(model_dir, dtype)
        for length in lengths:
            ids = [(i * 7919) % ours.shape.vocab_size for i in range(length)]
            ours.prefill(ids[:16], ours.new_cache(16))  # warm-up
            start = time.perf_counter()
            ours.prefill(ids, ours.new_cache(length))
            ours_s = time.perf_counter() - start
            row = {"model": model_dir.name.split("-")[0], "dtype": str(dtype).removeprefix("torch."),
                   "prompt_tokens": length, "prefill_ms": ours_s * 1000}
            if dtype == torch.float32:
                with torch.inference_mode():
                    start = time.perf_counter()
                    reference(torch.tensor([ids]), use_cache=True)
                    row["transformers_ms"] = (time.perf_counter() - start) * 1000
            rows.append(row)
    return rows


def render(serving: list[dict], prefill: list[dict]) -> str:
    lines = [
        f"Machine: {platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}, "
        f"{time.strftime('%Y-%m-%d')}. One run each; CPU timings on a shared 2-core machine are noisy (±15%).",
        "",
        "Serving over HTTP (greedy, streamed; tokens/s is aggregate across streams):",
        "",
        "| model | dtype | streams | tokens/s | per-stream tokens/s | TTFT p50 ms | aggregate vs 1 stream |",
        "|---|---|---|---|---|---|---|",
    ]
    single = {(r["model"], r["dtype"]): r["tokens_per_s"] for r in serving if r["streams"] == 1}
    for r in serving:
        ratio = r["tokens_per_s"] / single[(r["model"], r["dtype"])]
        lines.append(f"| {r['model']} | {r['dtype']} | {r['streams']} | {r['tokens_per_s']:.1f} | "
                     f"{r['per_stream_tokens_per_s']:.1f} | {r['ttft_ms']:.0f} | {ratio:.2f}× |")
    lines += [
        "",
        "Prefill (in-process; baseline: transformers' LlamaForCausalLM forward, float32, same weights):",
        "",
        "| model | dtype | prompt tokens | prefill ms | transformers ms | ours / transformers |",
        "|---|---|---|---|---|---|",
    ]
    for r in prefill:
        base = r.get("transformers_ms")
        base_cell = f"{base:.0f}" if base else "—"
        ratio_cell = f"{r['prefill_ms'] / base:.2f}×" if base else "—"
        lines.append(f"| {r['model']} | {r['dtype']} | {r['prompt_tokens']} | {r['prefill_ms']:.0f} | "
                     f"{base_cell} | {ratio_cell} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="tiny,small")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prefill", default="128,512,2048")
    parser.add_argument("--write", type=Path, help="update this markdown file's engine section")
    args = parser.parse_args()
    serving: list[dict] = []
    prefill: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets.split(","):
            model_dir = built_model(preset, 0)
            for dtype in ("float64", "float32"):
                serving += bench_serving(model_dir, dtype, args.max_tokens, Path(tmp))
            prefill += bench_prefill(model_dir, [int(n) for n in args.prefill.split(",")])
    table = render(serving, prefill)
    print(table)
    if args.write:
        replace_section(args.write, "## Reference engine (bench/engine.py)", table)


if __name__ == "__main__":
    main()
