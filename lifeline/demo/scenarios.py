"""What the demo does to the fleet, and what it measures at the client.

Each scenario returns a `Outcome`: one printed line of what was measured,
and whether the promise held. Streams are greedy (`temperature 0`), so an
undisturbed run is the reference a disturbed one must equal token by token.
"""

from __future__ import annotations

import json
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

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


class SteadyTraffic:
    """Short greedy streams one after another at a gateway, in a thread, counting the ones that broke."""

    def __init__(self, gateway_url: str, max_tokens: int = 12) -> None:
        self.gateway_url = gateway_url
        self.max_tokens = max_tokens
        self.ok = 0
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="demo-traffic", daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                run = stream(self.gateway_url, max_tokens=self.max_tokens)
                if len(run.token_ids) == self.max_tokens:
                    self.ok += 1
                else:
                    self.failed.append(f"short: {len(run.token_ids)} tokens")
            except (RuntimeError, httpx.HTTPError) as exc:
                self.failed.append(str(exc)[:200])

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)


def _last_event_id(fleet: DemoFleet) -> int:
    events = fleet.api("GET", "/events", params={"limit": 1000}).json()
    return max((e["id"] for e in events), default=0)


def _events_since(fleet: DemoFleet, after_id: int) -> list[dict]:
    return sorted(fleet.api("GET", "/events", params={"after_id": after_id, "limit": 1000}).json(),
                  key=lambda e: e["id"])


def zonal_shift(fleet: DemoFleet, region: Region, zone: str, *, streams: int = 4, max_tokens: int = 16) -> Outcome:
    """Shift a zone out (POST /api/v1/zonal-shifts) under steady traffic; the other zone serves it all; cancel."""
    gateway = region.gateway
    in_zone = [e for e in region.engines if e.zone == zone]
    others = [e for e in region.engines if e.zone != zone]
    first_event = _last_event_id(fleet)
    with SteadyTraffic(gateway.url) as traffic:
        time.sleep(0.5)  # streams in flight when the shift starts
        started = time.monotonic()
        shift = fleet.api("POST", "/zonal-shifts", json={"region": region.name, "zone": zone, "expires_in": 600,
                                                         "reason": "demo: zone shifted out"}).json()
        shift_s = time.monotonic() - started
        cutover = fleet.api("GET", f"/cutovers/{shift['cutover_id']}").json()
        report = fleet.wait_applied(fleet.snapshot_version(), engines=0)[gateway.replica_id]
        before = {e.instance_id: generated_tokens(e) for e in region.engines}
        for _ in range(streams):
            stream(gateway.url, max_tokens=max_tokens)
        after = {e.instance_id: generated_tokens(e) for e in region.engines}
    shifted_tokens = sum(after[e.instance_id] - before[e.instance_id] for e in in_zone)
    served_tokens = sum(after[e.instance_id] - before[e.instance_id] for e in others)
    live = sorted(e["instance_id"] for e in report["live_endpoints"])
    fleet.api("DELETE", f"/zonal-shifts/{shift['id']}", params={"reason": "demo: zone healthy again"})
    fleet.wait_applied(fleet.snapshot_version())  # every engine routable again
    tiered = [f"{e['kind']}({e['routing_tier']})" for e in _events_since(fleet, first_event) if e["routing_tier"]]
    tiers = [s["tier"] for s in cutover["steps"]]
    ok = (cutover["state"] == "completed" and shifted_tokens == 0 and served_tokens >= streams * max_tokens
          and not traffic.failed and all(e.instance_id not in live for e in in_zone))
    line = (f"zonal shift of {zone} (cutover {cutover['id']} {cutover['state']} in {shift_s:.1f} s, tiers {tiers}): "
            f"{gateway.replica_id} routes to {live}; while shifted {served_tokens:.0f} tokens were generated in "
            f"{'/'.join(sorted({e.zone for e in others}))}, {shifted_tokens:.0f} in {zone}; steady traffic through "
            f"the shift: {traffic.ok} streams ok, {len(traffic.failed)} broken; cancelled, {zone} routable again; "
            f"routing_tier events: {', '.join(tiered)}")
    return Outcome(line, ok)


def _slo_status(fleet: DemoFleet) -> dict[str, str]:
    document = fleet.api("GET", f"/slo/{MODEL}").json()
    return {f["metric"]: f["status"] for entry in document["triple"] for f in entry["figures"]}


DRILL = "demo-weekly-kill"


def instance_drill(fleet: DemoFleet, region: Region, victim: Engine, timeout: float = 240.0) -> Outcome:
    """An instance drill (SIGKILL under traffic) requested through the drill API; its report; the SLO line."""
    fleet.write_drill_fleet(region)
    slo_before = _slo_status(fleet)
    fleet.api("POST", "/drills", json={
        "name": DRILL, "model": MODEL, "scope": "instance", "fault": "sigkill",
        "blast_radius": {"region": region.name, "instances": [victim.instance_id], "max_instances": 1},
        "targets": {"request_rto_s": 5.0, "token_rpo_tokens": 0, "rto_quality_s": 180.0},
        "traffic": {"requests": 4, "concurrency": 2, "max_tokens": 24, "fault_after_tokens": 6,
                    "token_delay_ms": 40.0}})
    run = fleet.api("POST", f"/drills/{DRILL}/runs").json()
    deadline = time.monotonic() + timeout
    while run["state"] not in ("passed", "failed", "aborted"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"drill run {run['id']} still {run['state']} after {timeout:.0f} s")
        time.sleep(0.5)
        run = fleet.api("GET", f"/drills/runs/{run['id']}").json()
    report = run.get("report") or {}
    measured = report.get("measured", {})
    slo_after = _slo_status(fleet)
    metric = "request_rto_s"
    files = [p for p in report.get("files", []) if str(p).endswith(".md")]
    line = (f"instance drill run {run['id']} ({DRILL}, SIGKILL {victim.instance_id} under traffic) {run['state']}: "
            f"request RTO {_fmt(measured.get('request_rto_s'))} s, token RPO {_count(measured.get('token_rpo_tokens'))}, "
            f"requests lost {_count(measured.get('requests_lost'))}, detection {_fmt(measured.get('detection_s'))} s, "
            f"RTO_quality {_fmt(measured.get('rto_quality_s'))} s; tiers {report.get('routing_tiers_in_order')}; "
            f"report {files[0] if files else '(none written)'}; SLO {metric}: {slo_before.get(metric)} → "
            f"{slo_after.get(metric)}")
    ok = run["state"] == "passed" and slo_before.get(metric) == "unverified" and slo_after.get(metric) == "measured"
    return Outcome(line, ok)


def _count(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


_TIER_DAEMONS = {"dns": ("BIND9", "named"), "anycast": ("BIRD 2 + ExaBGP", "bird"), "l7 (HAProxy)": ("HAProxy", "haproxy")}


def tiers_line() -> str:
    """Which routing tiers acted for real in this run, and which daemons sat unused."""
    installed = [f"{name} ({'installed' if shutil.which(binary) or Path('/usr/sbin', binary).exists() else 'not installed'})"
                 for name, binary in _TIER_DAEMONS.values()]
    return ("l7 ran for real: the control plane's snapshot drained the zone and the region's gateway applied it; "
            "the gateway's own instance ejection in the drill is an l7 event too. "
            f"dns, anycast and HAProxy did not run: {', '.join(installed)} — the served control plane wires no "
            "driver for them yet (docs/cutover.md), so the zonal shift planned an l7 step only and nothing was "
            "recorded for those tiers")
