"""What the demo does to the fleet, and what it measures at the client.

Each scenario returns a `Outcome`: one printed line of what was measured,
and whether the promise held. Streams are greedy (`temperature 0`), so an
undisturbed run is the reference a disturbed one must equal token by token.
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass, field

import httpx
from httpx_sse import connect_sse

from lifeline.demo.fleet import MODEL, DemoFleet, Engine, Region
from lifeline.processes import scrape_metric

PROMPT = "The primary region lost power, so the gateway"


@dataclass
class Outcome:
    line: str
    ok: bool


@dataclass
class StreamRun:
    token_ids: list[int] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    text: str = ""
    arrivals: list[float] = field(default_factory=list)
    killed_at: float | None = None


def stream(gateway_url: str, *, max_tokens: int, prefer: str | None = None, kill_after: int | None = None,
           victim: Engine | None = None) -> StreamRun:
    """One streamed greedy completion; with `victim`, SIGKILL it once `kill_after` tokens reached the client."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "return_token_ids": True}
    headers = {"X-Lifeline-Prefer-Instance": prefer} if prefer else {}
    run = StreamRun()
    with httpx.Client(timeout=120) as client, connect_sse(
        client, "POST", f"{gateway_url}/v1/completions", json=body, headers=headers
    ) as source:
        source.response.raise_for_status()
        for event in source.iter_sse():
            if event.data == "[DONE]":
                break
            chunk = json.loads(event.data)
            if event.event == "error" or "error" in chunk:
                raise RuntimeError(f"stream ended with an error: {chunk}")
            choice = chunk["choices"][0]
            run.token_ids += choice.get("token_ids", [])
            run.text += choice.get("text", "")
            run.seqs.append(chunk["lifeline"]["seq"])
            run.arrivals.append(time.monotonic())
            if victim is not None and kill_after is not None and run.killed_at is None and len(run.token_ids) >= kill_after:
                victim.kill(signal.SIGKILL)
                run.killed_at = time.monotonic()
    return run


def mark(ok: bool) -> str:
    return "[green]yes[/]" if ok else "[red]NO[/]"


def engine_kill(region: Region, victim: Engine, reference: StreamRun, *, max_tokens: int, kill_after: int) -> Outcome:
    """SIGKILL the engine serving a stream mid-flight: the client's tokens must equal the undisturbed run's."""
    gateway = region.gateway
    migrations_before = gateway.metric("lifeline_gateway_migrations_total")
    faulted = stream(gateway.url, max_tokens=max_tokens, prefer=victim.instance_id, kill_after=kill_after, victim=victim)
    migrations = gateway.metric("lifeline_gateway_migrations_total") - migrations_before
    identical = faulted.token_ids == reference.token_ids
    contiguous = faulted.seqs == list(range(len(faulted.seqs)))
    gaps = [b - a for a, b in zip(faulted.arrivals, faulted.arrivals[1:])]
    rto_ms = max(gaps) * 1000 if gaps else float("nan")
    line = (f"SIGKILL {victim.instance_id} ({victim.zone}) after {kill_after} tokens: the stream went on with "
            f"{len(faulted.token_ids)} tokens; identical to reference: {mark(identical)}; "
            f"seq 0..{len(faulted.seqs) - 1} contiguous: {mark(contiguous)}; migrations: {migrations:.0f}; "
            f"request RTO (largest gap between tokens at the client): {rto_ms:.0f} ms")
    return Outcome(line, identical and contiguous and migrations == 1)


def restart(region: Region, engine: Engine, timeout: float = 120.0) -> tuple[int, int]:
    """Start the killed engine again; (generation before, generation after) as the gateway's registry sees them."""
    before = region.gateway.leases().get(engine.instance_id, 0)
    engine.start()
    return before, region.gateway.wait_generation_above(engine.instance_id, before, timeout=timeout)


def generated_tokens(engine: Engine) -> float:
    try:
        return scrape_metric(f"{engine.url}/metrics", "vllm:generation_tokens_total")
    except httpx.TransportError:
        return 0.0


def snapshot_line(fleet: DemoFleet) -> str:
    version = fleet.snapshot_version()
    reports = fleet.wait_applied(version)
    parts = []
    for region in fleet.regions.values():
        report = reports[region.gateway.replica_id]
        endpoints = sorted(f"{e['instance_id']}@{e['zone']}" for e in report["live_endpoints"])
        parts.append(f"{report['replica_id']} applied snapshot {report['snapshot_version']} "
                     f"(routing_source {report['routing_source']}; live: {', '.join(endpoints)})")
    return f"control plane serves snapshot {version}; " + "; ".join(parts)
