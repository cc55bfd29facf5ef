"""TTFT of a session's first turn after a region failover, with its KV checkpoint replicated and without.

Issue 12 asks for the cost of RPO_context at the client: the first turn a session takes at the standby
region. Two regions on real processes, each a gateway (`lifeline gateway serve`, sessions on) and an engine
with its own checkpoint store. Per run, two sessions of the same shape take `--turns` chat turns at the
primary: one of class `critical` (the gateway checkpoints its KV after every turn), one `rebuildable`
(never). The checkpoints are then copied to the standby store by the replication worker's own copy
(`controlplane.replication.flows.copy_verified`: every block verified on both sides), the primary's
gateway and engine are SIGKILLed, and each session's next turn is streamed from the standby's gateway with
the official `openai` client. Measured per session: TTFT at the client, and the context the standby's
engine restored vs re-prefilled (`lifeline.session` on the stream's usage chunk). The answer must equal
the same turn on an engine that never failed over (greedy, float64): a checkpoint may change how fast, not
what.

Every run uses fresh sessions (their contexts share at most the chat template's first block), and the order of the two alternates from
run to run, so machine drift spreads over both. Median and range over `--runs`.

    .venv/bin/python -m bench.session_failover [--preset small] [--turns 2] [--runs 3] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import platform
import signal
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

from bench.docs import replace_section
from common import oneshot_http
from contract.kv_checkpoint import KVCheckpointStore, open_kv_store
from contract.session import SessionStore
from controlplane.replication.flows import copy_verified, scan_pending
from lifeline.processes import EngineProcess, GatewayProcess, built_model, free_port, gateway_config

HEADING = "## First turn after a region failover (bench/session_failover.py)"
ALIAS = "bench"
CLASSES = ("critical", "rebuildable")
POLICIES = [{"model": ALIAS, "session_class": "critical", "revision": 1, "mode": "critical",
             "rpo_context_seconds": 30, "rpo_context_turns": 0},
            {"model": ALIAS, "session_class": "rebuildable", "revision": 1, "mode": "rebuildable",
             "rpo_context_seconds": 0}]
# A long, per-session system prompt makes the context the failover must restore (prefill is what a
# checkpoint saves; decoding the turns that build it up would cost far more on these CPUs).
RUNBOOK = ("You are the on-call assistant for the {name} fleet. Runbook: when a zone is lost, drain its "
           "engines, promote the warm pool, confirm the canary on every promoted instance, then shift the "
           "zone at the anycast tier and watch TTFT p99 until it is back within target. When a region is "
           "lost, cut over at the DNS tier, keep the TTL short, and continue every session from its "
           "replicated checkpoint where the policy says so. Record every step in the event log. ") * 3
FOLLOW_UPS = ["What do we check first?", "And after that?", "How do we know it worked?", "What if it did not?"]


@dataclass
class Region:
    engine: EngineProcess
    gateway: GatewayProcess
    store_url: str
    sessions_dir: Path


def start_region(name: str, model: Path, work: Path) -> Region:
    store_url = f"file://{work / f'{name}-kv'}"
    sessions_dir = work / f"{name}-sessions"
    # The small preset prefills a long context in seconds on busy CPUs: a first-token timeout sized for
    # tests would migrate a healthy prefill, and the bench would measure the recovery, not the failover.
    config = gateway_config(model, alias=ALIAS, sessions={"store": str(sessions_dir), "policies": POLICIES},
                            recovery={"first_token_timeout": 600.0, "stall_timeout": 60.0})
    gateway = GatewayProcess(config, free_port(), work, replica_id=f"gateway-{name}")
    gateway.start()
    gateway.wait_live()
    engine = EngineProcess(model, free_port(), f"{name}-1", work / f"{name}-state", work / f"engine-{name}.log",
                           extra_args=[*gateway.registry_args(), "--enable-kv-admin", "--kv-checkpoint-store",
                                       store_url, "--kv-checkpoint-every", "1000000"])
    engine.start()
    engine.wait_ready()
    gateway.wait_routable(ALIAS, 1)
    return Region(engine, gateway, store_url, sessions_dir)


def messages(name: str, answers: list[str]) -> list[dict[str, str]]:
    convo = [{"role": "system", "content": RUNBOOK.format(name=name)}, {"role": "user", "content": FOLLOW_UPS[0]}]
    for answer, follow_up in zip(answers, FOLLOW_UPS[1:], strict=False):
        convo += [{"role": "assistant", "content": answer}, {"role": "user", "content": follow_up}]
    return convo


def turn(url: str, session: str, session_class: str, convo: list[dict[str, str]], max_tokens: int,
         model: str = ALIAS) -> dict[str, Any]:
    body = {"model": model, "messages": convo, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "return_token_ids": True}
    response = oneshot_http.post(f"{url}/v1/chat/completions", json=body, timeout=900,
                                 headers={"X-Session-Id": session, "X-Session-Class": session_class})
    response.raise_for_status()
    return response.json()["choices"][0]


def streamed_turn(url: str, session: str, session_class: str, convo: list[dict[str, str]],
                  max_tokens: int) -> tuple[float, list[int], dict[str, Any]]:
    """(TTFT at the client, the answer's token ids, the turn's `lifeline.session` figures)."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=900)
    began = time.perf_counter()
    ttft: float | None = None
    token_ids: list[int] = []
    figures: dict[str, Any] = {}
    stream = client.chat.completions.create(
        model=ALIAS, messages=convo, max_tokens=max_tokens, temperature=0.0, stream=True,
        stream_options={"include_usage": True},
        extra_headers={"X-Session-Id": session, "X-Session-Class": session_class},
        extra_body={"ignore_eos": True, "return_token_ids": True})
    for chunk in stream:
        for choice in chunk.choices:
            ids = (choice.model_extra or {}).get("token_ids") or []
            if ids and ttft is None:
                ttft = time.perf_counter() - began
            token_ids += ids
        figures = ((chunk.model_extra or {}).get("lifeline") or {}).get("session") or figures
    if ttft is None:
        raise RuntimeError(f"{session}: the stream ended without a token")
    return ttft, token_ids, figures


def one_run(run: int, model: Path, work: Path, turns: int, max_tokens: int,
            reference: EngineProcess) -> list[dict[str, Any]]:
    primary, standby = start_region("primary", model, work / f"run{run}"), None
    try:
        standby = start_region("standby", model, work / f"run{run}")
        sessions = {cls: f"run{run}-{cls}" for cls in CLASSES}
        answers: dict[str, list[str]] = {cls: [] for cls in CLASSES}

        def converse(cls: str) -> None:
            for _ in range(turns):
                choice = turn(primary.gateway.url, sessions[cls], cls, messages(sessions[cls], answers[cls]), max_tokens)
                answers[cls].append(choice["message"]["content"])

        with concurrent.futures.ThreadPoolExecutor(len(CLASSES)) as pool:
            list(pool.map(converse, CLASSES))
        records = SessionStore(open_kv_store(str(primary.sessions_dir)))
        deadline = time.monotonic() + 60
        while (record := records.get(ALIAS, sessions["critical"])) is None or record.checkpointed_turn < turns:
            if time.monotonic() > deadline:
                raise TimeoutError("the critical session's last checkpoint never reached the primary store")
            time.sleep(0.1)
        source, target = (KVCheckpointStore(open_kv_store(r.store_url)) for r in (primary, standby))
        for pending in scan_pending(source, target, skip=set(), not_before=0.0).pending:
            copy_verified(source, target, pending.key)
        primary.engine.kill(signal.SIGKILL)
        primary.gateway.kill(signal.SIGKILL)

        rows = []
        for cls in (CLASSES if run % 2 == 0 else CLASSES[::-1]):
            convo = messages(sessions[cls], answers[cls])
            ttft, token_ids, figures = streamed_turn(standby.gateway.url, sessions[cls], cls, convo, max_tokens)
            expected = turn(reference.url, f"reference-{run}-{cls}", "rebuildable", convo, max_tokens,
                            model=model.name)["token_ids"]
            rows.append({"class": cls, "ttft_s": ttft, "identical": token_ids == expected, **figures})
        return rows
    finally:
        for region in (primary, standby):
            if region is not None:
                region.engine.kill()
                region.gateway.kill()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="small")
    parser.add_argument("--turns", type=int, default=2, help="turns each session takes at the primary")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per answer")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    model = built_model(args.preset, 0)
    results: dict[str, list[dict[str, Any]]] = {cls: [] for cls in CLASSES}
    with tempfile.TemporaryDirectory(prefix="lifeline-bench-failover-") as tmp:
        work = Path(tmp)
        # The undisturbed answers come from an engine that never failed over (and checkpoints nothing).
        reference = EngineProcess(model, free_port(), "reference", work / "reference-state", work / "reference.log",
                                  extra_args=["--kv-cache-blocks", "0"])
        reference.start()
        reference.wait_ready()
        try:
            for run in range(args.runs):
                for row in one_run(run, model, work, args.turns, args.max_tokens, reference):
                    results[row["class"]].append(row)
                    print(f"run {run}: {row['class']:<11} TTFT {row['ttft_s'] * 1000:7.0f} ms, context "
                          f"{row.get('context_tokens')}, restored {row.get('cached_tokens')}, re-prefilled "
                          f"{row.get('context_recomputed_tokens')}, identical {row['identical']}", flush=True)
        finally:
            reference.kill()
    table = render(results, args)
    print(table)
    if args.write:
        replace_section(args.write, HEADING, table)


def render(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> str:
    base = statistics.median(r["ttft_s"] for r in results["rebuildable"])
    lines = [f"{args.preset} preset, float64, {args.turns} turns of {args.max_tokens} tokens at the primary, then one "
             f"streamed turn at the standby; median [range] over {args.runs} runs on {platform.machine()} "
             f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, 2 shared cores).", "",
             "| session class | checkpoint at the standby | context tokens | restored | re-prefilled | TTFT p50 [range] "
             "| vs without | token-identical |", "|---|---|---:|---:|---:|---:|---:|---|"]
    for cls in CLASSES:
        rows = results[cls]
        ttfts = [r["ttft_s"] * 1000 for r in rows]
        median = statistics.median(r["ttft_s"] for r in rows)
        lines.append(
            f"| {cls} | {'replicated, verified' if cls == 'critical' else 'none (rebuildable)'} "
            f"| {statistics.median(r.get('context_tokens') or 0 for r in rows):.0f} "
            f"| {statistics.median(r.get('cached_tokens') or 0 for r in rows):.0f} "
            f"| {statistics.median(r.get('context_recomputed_tokens') or 0 for r in rows):.0f} "
            f"| {statistics.median(ttfts):.0f} ms [{min(ttfts):.0f}–{max(ttfts):.0f}] | {median / base:.2f}x "
            f"| {'yes' if all(r['identical'] for r in rows) else 'NO'} |")
    lines += ["", "Restored: context tokens the standby's engine took from the replicated checkpoint (or its prefix "
              "cache) instead of prefilling them; a critical session re-prefills only the last partial 16-token block. "
              "A rebuildable session can restore a first block that another session's checkpoint shares (the chat "
              "template's opening). TTFT includes the gateway, the import of the checkpoint and the prefill of "
              "what it did not cover; the answers equal an engine's that never failed over."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
