"""Gateway overhead: the same streams direct to an engine, through the gateway, and through LiteLLM's proxy.

Measures time to first token, inter-token latency (p50/p99 over every gap of
every stream) and aggregate tokens/s at 1 and 32 concurrent streams, greedy,
`tiny` preset (fast enough that a fraction of a millisecond shows). Engine,
gateway (or LiteLLM) and client share this machine's CPUs, so a proxy's own
CPU time is taken from the engine: on 2 cores that is the dominant cost, not
network hops. So the proxy's own CPU time per token (user + system, from
/proc, process tree) is reported too: unlike latency it barely moves with
other load on the machine.

Fairness: one engine serves every path; the same prompt, `max_tokens` and
`ignore_eos`, and every stream must end with `finish_reason: "length"`, so
every path generates exactly the same tokens; the client code is the same on
every path (it parses each event's JSON). Each path gets a warm-up run at full
concurrency (connection pools, engine) before it is measured; a run repeats
sequential rounds until it holds at least `--min-gaps` inter-token gaps, so
p99 at 1 stream is not just the maximum of 63 gaps; the order of the paths
rotates between repeats. Other load on a 2-core machine moves a whole run by
more than the effect measured, so each figure is the median over repeats, and
each difference (proxy − direct, proxy / direct) is the median of the
differences within a repeat, where both paths ran back to back.

A token is an event whose choice carries `text`. LiteLLM does not forward
chunks whose text is empty (a token that ends mid-character), so on its path
a few gaps span two tokens; tokens/s counts the tokens generated
(`max_tokens` per stream), not the events.

LiteLLM's proxy (optional, `--litellm`, on by default when its virtualenv
exists at .lifeline/litellm-venv) runs with its defaults and a `hosted_vllm/`
model entry whose api_base is the engine; it needs its own virtualenv:

    python3.11 -m venv .lifeline/litellm-venv && .lifeline/litellm-venv/bin/pip install 'litellm[proxy]'
    .venv/bin/python -m bench.gateway_overhead [--streams 1,32] [--tokens 64] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import platform
import secrets
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml
from httpx_sse import connect_sse

ROOT = Path(__file__).resolve().parent.parent

from bench.docs import replace_section
from lifeline.processes import EngineProcess, GatewayProcess, built_model, free_port, gateway_config, wait_for_http_ok

PROMPT = "Gateways add latency only where they must"
LITELLM_VENV = ROOT / ".lifeline" / "litellm-venv"


@dataclass
class Target:
    label: str
    url: str
    model: str
    headers: dict[str, str] = field(default_factory=dict)
    pid: int | None = None  # the proxy's process, whose CPU time per token is reported


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its live descendants, from /proc (Linux)."""
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _TICK
            for task in Path(f"/proc/{current}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def one_stream(path: Target, max_tokens: int) -> tuple[float, list[float], str | None]:
    body = {"model": path.model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    start = time.perf_counter()
    stamps: list[float] = []
    finish = None
    with httpx.Client(timeout=600, headers=path.headers) as client, \
            connect_sse(client, "POST", f"{path.url}/v1/completions", json=body) as source:
        for event in source.iter_sse():
            if event.data == "[DONE]":
                break
            now = time.perf_counter()
            chunk = json.loads(event.data)
            choice = chunk["choices"][0] if chunk.get("choices") else {}
            if "text" in choice:
                stamps.append(now)
            finish = choice.get("finish_reason") or finish
    return stamps[0] - start, [b - a for a, b in zip(stamps, stamps[1:])], finish


def run(path: Target, streams: int, max_tokens: int, *, min_gaps: int = 1000) -> dict:
    rounds = max(1, math.ceil(min_gaps / (streams * (max_tokens - 1))))
    ttfts: list[float] = []
    gaps: list[float] = []
    cpu_before = cpu_seconds(path.pid) if path.pid else 0.0
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        for _ in range(rounds):
            for ttft, stream_gaps, finish in pool.map(lambda _: one_stream(path, max_tokens), range(streams)):
                if finish != "length":  # every path must generate the same tokens
                    raise RuntimeError(f"{path.label}: a stream ended with {finish!r}, not 'length'")
                ttfts.append(ttft)
                gaps.extend(stream_gaps)
    wall = time.perf_counter() - start
    tokens = rounds * streams * max_tokens
    proxy_cpu = (cpu_seconds(path.pid) - cpu_before) / tokens * 1e6 if path.pid else None
    gaps.sort()
    return {
        "ttft_p50_ms": statistics.median(ttfts) * 1000,
        "itl_p50_ms": statistics.median(gaps) * 1000,
        "itl_p99_ms": gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))] * 1000,
        "tokens_per_s": tokens / wall,
        "gaps": len(gaps),
        "proxy_cpu_us": proxy_cpu,
    }


class LiteLLMProxy:
    """LiteLLM's proxy from its own virtualenv, with a hosted_vllm model entry pointing at the engine."""

    def __init__(self, engine_url: str, engine_model: str, port: int, workdir: Path) -> None:
        self.port = port
        self.key = "sk-" + secrets.token_hex(16)  # the proxy refuses to start without a master key
        self.config = workdir / "litellm.yaml"
        self.config.write_text(yaml.safe_dump({
            "model_list": [{"model_name": "tiny", "litellm_params": {
                "model": f"hosted_vllm/{engine_model}", "api_base": f"{engine_url}/v1", "api_key": "none"}}],
            "litellm_settings": {"telemetry": False},
        }))
        self.log_path = workdir / "litellm.log"
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> None:
        env = {**os.environ, "LITELLM_MASTER_KEY": self.key, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        cmd = [str(LITELLM_VENV / "bin" / "litellm"), "--config", str(self.config), "--host", "127.0.0.1", "--port", str(self.port)]
        self.process = subprocess.Popen(cmd, stdout=open(self.log_path, "ab"), stderr=subprocess.STDOUT, env=env)
        wait_for_http_ok(f"{self.url}/health/liveliness", self.process, name="litellm", log_path=self.log_path,
                         timeout=timeout, interval=0.2)

    def version(self) -> str:
        out = subprocess.run([str(LITELLM_VENV / "bin" / "python"), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
                             capture_output=True, text=True, check=False)
        return out.stdout.strip() or "?"

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=15)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", default="1,32")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5, help="runs per path, order rotated; medians reported")
    parser.add_argument("--min-gaps", type=int, default=1000, help="sequential rounds until a run holds this many gaps")
    parser.add_argument("--litellm", action=argparse.BooleanOptionalAction, default=(LITELLM_VENV / "bin" / "litellm").exists(),
                        help="also measure LiteLLM's proxy (needs .lifeline/litellm-venv)")
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    model = built_model("tiny", 0)
    work = Path(tempfile.mkdtemp(prefix="bench-gw-"))
    gw = GatewayProcess(gateway_config(model, admission={"max_concurrency_per_engine": 64, "max_queue": 64}), free_port(), work)
    gw.start()
    gw.wait_live()
    engine = EngineProcess(model, free_port(), "bench-eng", work / "state", work / "engine.log", extra_args=gw.registry_args())
    engine.start()
    litellm = LiteLLMProxy(engine.url, model.name, free_port(), work) if args.litellm else None
    litellm_note = "LiteLLM proxy: not measured (run with --litellm after creating .lifeline/litellm-venv)."
    rows = []
    load_before = os.getloadavg()[0]
    try:
        engine.wait_ready()
        gw.wait_routable("tiny", 1)
        paths = [Target("direct", engine.url, model.name), Target("gateway", gw.url, "tiny", pid=gw.process.pid)]
        if litellm is not None:
            litellm.start()
            paths.append(Target("litellm", litellm.url, "tiny", {"Authorization": f"Bearer {litellm.key}"}, pid=litellm.process.pid))
            litellm_note = (f"LiteLLM {litellm.version()} proxy (own venv, defaults, `hosted_vllm/` entry on the same engine; "
                            "it drops empty-text chunks, so a few of its gaps span two tokens; it does not resume streams).")
        for streams in [int(s) for s in args.streams.split(",")]:
            for path in paths:
                run(path, streams, 8, min_gaps=0)  # warm-up at full concurrency: pools, engine
            runs: dict[str, list[dict]] = {path.label: [] for path in paths}
            for repeat in range(args.repeats):
                order = paths[repeat % len(paths):] + paths[: repeat % len(paths)]
                for path in order:
                    runs[path.label].append(run(path, streams, args.tokens, min_gaps=args.min_gaps))
                    print(path.label, streams, runs[path.label][-1], flush=True)
            metrics = ("ttft_p50_ms", "itl_p50_ms", "itl_p99_ms", "tokens_per_s", "proxy_cpu_us")
            for path in paths:
                median = {m: None if runs[path.label][0][m] is None else statistics.median(r[m] for r in runs[path.label]) for m in metrics}
                rows.append({"path": path.label, "streams": streams, **median, "gaps": runs[path.label][0]["gaps"]})
            for path in paths[1:]:
                pairs = list(zip(runs[path.label], runs["direct"]))
                rows.append({"path": f"{path.label} − direct", "streams": streams, "ratio": True, "gaps": runs[path.label][0]["gaps"],
                             **{m: statistics.median(g[m] - d[m] for g, d in pairs) for m in metrics[:3]},
                             "tokens_per_s": statistics.median(g["tokens_per_s"] / d["tokens_per_s"] for g, d in pairs),
                             "proxy_cpu_us": None,
                             "range": (min(g["tokens_per_s"] / d["tokens_per_s"] for g, d in pairs),
                                       max(g["tokens_per_s"] / d["tokens_per_s"] for g, d in pairs),
                                       min(g["itl_p50_ms"] - d["itl_p50_ms"] for g, d in pairs),
                                       max(g["itl_p50_ms"] - d["itl_p50_ms"] for g, d in pairs))})
    finally:
        if litellm is not None:
            litellm.kill()
        engine.kill()
        gw.kill()
    lines = [
        f"Machine: {platform.machine()}, {len(os.sched_getaffinity(0))} CPUs shared by engine, proxy and client "
        f"(1-minute load average {load_before:.2f} before the run; the run itself then adds about 3); `tiny` preset, float64, greedy, "
        f"{args.tokens} tokens per stream (every stream checked to end by length), ≥ {args.min_gaps} gaps per run, "
        f"medians of {args.repeats} runs per path in rotating order (differences: medians of back-to-back pairs, "
        f"range of the pairs in brackets). {litellm_note}",
        "",
        "| path | streams | TTFT p50 ms | ITL p50 ms | ITL p99 ms | tokens/s | gaps | proxy CPU µs/token |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        tps = f"{r['tokens_per_s']:.1f}"
        itl = f"{r['itl_p50_ms']:.2f}"
        if r.get("ratio"):
            low_tps, high_tps, low_itl, high_itl = r["range"]
            tps = f"{r['tokens_per_s']:.2f}× of direct [{low_tps:.2f}, {high_tps:.2f}]"
            itl = f"{r['itl_p50_ms']:.2f} [{low_itl:.2f}, {high_itl:.2f}]"
        cpu = "" if r["proxy_cpu_us"] is None else f"{r['proxy_cpu_us']:.0f}"
        lines.append(f"| {r['path']} | {r['streams']} | {r['ttft_p50_ms']:.2f} | {itl} | {r['itl_p99_ms']:.2f} | {tps} | {r['gaps']} | {cpu} |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        replace_section(args.write, "## Gateway overhead (bench/gateway_overhead.py)", table)


if __name__ == "__main__":
    main()
