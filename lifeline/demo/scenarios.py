"""What the demo does to the fleet, and what it measures: one `Row` per scenario.

Streams are greedy (`temperature 0`, `ignore_eos`), sent with the official
`openai` client, so an undisturbed run is the reference a disturbed one
must equal token by token. `Traffic` keeps short streams flowing at each
region's gateway for the whole run and records every request (start, end,
tokens, error): the rows' requests lost, wrong answers and RTO_latency (the
drills' one definition, `controlplane.drill.measure.rto_latency`) are read
from it, the timeline plot too. Detection times and the `routing_tier`
events come from the control plane's event log (`GET /api/v1/events`).
Every number is measured in the run; a figure that could not be measured
is `None` and printed as `n/a`.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Self

import httpx

from common import oneshot_http
from controlplane.event.dataplane import is_wrong_output_verdict
from lifeline.demo.fleet import (
    CANARY_JITTER,
    CANARY_PER_INSTANCE_PER_S,
    MODEL,
    OPERATOR,
    STEP_STALL_BOUND_S,
    DemoFleet,
    PoolEngine,
    Region,
)
from lifeline.demo.tiers import RealTiers
from lifeline.processes import scrape_metric

PROMPT = "The primary region lost power, so the gateway"
STEADY_TOKENS = 12
PACE_MS = 30.0  # the victim's per-token delay while a stream pinned to it is faulted
EVENT_FLUSH_S = 15.0  # how long an agent event may take to reach the log: batched, on a loaded two-core machine


@dataclass
class Row:
    """One scenario: what failed and what the client and the control plane saw."""

    scenario: str
    failed: str
    detection_s: float | None = None
    rto_latency_s: float | None = None
    request_rto_s: float | None = None
    token_rpo: int | None = None
    rpo_context: int | None = None
    requests_lost: int | None = None
    tiers: list[str] = field(default_factory=list)
    ok: bool = False
    line: str = ""
    note: str = ""  # a promise of another component that this run saw exceeded, though the scenario's held
    fault_at: float = 0.0  # monotonic, for the timeline
    ended_at: float = 0.0


@dataclass
class StreamRun:
    token_ids: list[int] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    epochs: list[int] = field(default_factory=list)
    text: str = ""
    arrivals: list[float] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0
    error: str | None = None

    def ttft(self) -> float | None:
        return self.arrivals[0] - self.started if self.arrivals else None


def stream(gateway_url: str, *, max_tokens: int, prefer: str | None = None,
           on_token: Callable[[StreamRun], None] | None = None, headers: dict[str, str] | None = None) -> StreamRun:
    """One streamed greedy completion through the gateway with the `openai` client; errors are recorded, not raised."""
    import openai

    run = StreamRun(started=time.monotonic())
    client = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="demo", max_retries=0, timeout=120.0)
    try:
        chunks = client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=max_tokens, temperature=0.0, stream=True,
            extra_headers={**(headers or {}), **({"X-Lifeline-Prefer-Instance": prefer} if prefer else {})},
            extra_body={"ignore_eos": True, "return_token_ids": True})
        for chunk in chunks:
            lifeline = (chunk.model_extra or {}).get("lifeline") or {}
            for choice in chunk.choices:
                ids = (choice.model_extra or {}).get("token_ids") or []
                run.token_ids += [int(t) for t in ids]
                run.text += choice.text or ""
                if ids:
                    run.arrivals.append(time.monotonic())
                    if "seq" in lifeline:
                        run.seqs.append(int(lifeline["seq"]))
                    run.epochs.append(int(lifeline.get("epoch", 0)))
                    if on_token is not None:
                        on_token(run)
        if len(run.token_ids) < max_tokens:
            run.error = f"stream ended after {len(run.token_ids)} of {max_tokens} tokens"
    except Exception as error:  # noqa: BLE001 - openai.APIError and transport errors alike: the request is lost
        run.error = f"{type(error).__name__}: {error}"[:300]
    finally:
        run.ended = time.monotonic()
        client.close()
    return run


def mark(ok: bool) -> str:
    return "[green]yes[/]" if ok else "[red]NO[/]"


def fmt(value: float | None, unit: str = " s") -> str:
    return "n/a" if value is None else f"{value:.2f}{unit}"


def count(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


# ---------------------------------------------------------------- steady traffic


@dataclass
class Traffic:
    """Short greedy streams one after another at a gateway, in a thread, every request recorded."""

    region: str
    gateway_url: str
    reference: list[int]
    headers: dict[str, str] = field(default_factory=dict)  # e.g. X-Lifeline-Cohort
    runs: list[StreamRun] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.runs.append(stream(self.gateway_url, max_tokens=STEADY_TOKENS, headers=self.headers))
            time.sleep(0.05)

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._loop, name=f"demo-traffic-{self.region}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=150)

    def between(self, start: float, end: float) -> list[StreamRun]:
        """Requests that overlapped [start, end]."""
        return [r for r in list(self.runs) if r.ended >= start and r.started <= end]

    def lost(self, start: float, end: float) -> int:
        return sum(1 for r in self.between(start, end) if r.error is not None)

    def wrong(self, start: float, end: float) -> list[StreamRun]:
        return [r for r in self.between(start, end) if r.error is None and r.token_ids != self.reference]

    def ttft_target(self) -> float:
        """3 × the median undisturbed time to first token of the steady streams so far (as drills judge it)."""
        ttfts = [t for r in list(self.runs)[:20] if r.error is None and (t := r.ttft()) is not None]
        return 3 * statistics.median(ttfts) if ttfts else 1.0

    def rto_latency(self, fault_at: float, end_at: float | None = None) -> float | None:
        """RTO_latency of this traffic, as drills measure it (`controlplane.drill.measure.rto_latency`): fault →
        TTFT p99 over a sliding window back within the target for good, up to `end_at` (default: now).

        0.0 when TTFT never left the target (a fault that hurt only what was answered shows in token RPO).
        """
        from controlplane.drill import measure

        traces = [measure.RequestTrace(index=i, sampling="greedy", started_at=run.started,
                                       token_times=list(run.arrivals), token_ids=list(run.token_ids),
                                       ended_at=run.ended, error=run.error)
                  for i, run in enumerate(list(self.runs))]
        return measure.rto_latency(traces, fault_at=fault_at, end_at=time.monotonic() if end_at is None else end_at,
                                   ttft_target=self.ttft_target())

    def served_correctly_after(self, since: float) -> float | None:
        """When the first request started after `since` that was served in full and token-identical came back
        (its last token), or None: when the service answered right again, not a latency figure."""
        for run in list(self.runs):
            if run.started >= since and run.error is None and run.token_ids == self.reference:
                return run.ended
        return None


# ---------------------------------------------------------------- the event log


def last_event_id(fleet: DemoFleet) -> int:
    return max((e["id"] for e in events_since(fleet, 0)), default=0)


def events_since(fleet: DemoFleet, after_id: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    while True:
        page = fleet.api("GET", "/events", params={"after_id": after_id, "limit": 1000}).json()
        if not page:
            return sorted(found, key=lambda e: e["id"])
        found += page
        after_id = max(e["id"] for e in page)


def _events_of_kind(fleet: DemoFleet, after_id: int, kind: str, *, timeout: float) -> list[dict[str, Any]]:
    """Events of `kind` written after `after_id`, waiting up to `timeout` for the first; [] if none came."""
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in events_since(fleet, after_id) if e["kind"].endswith(kind)]
        if found or time.monotonic() >= deadline:
            return found
        time.sleep(0.2)


def tiered(events: list[dict[str, Any]]) -> list[str]:
    return [f"{e['kind']}({e['routing_tier']})" for e in events if e.get("routing_tier")]


def detection(events: list[dict[str, Any]], fault_wall: datetime, *, about: str | None = None) -> float | None:
    """fault → the first `routing_tier` event after it (about one instance, when named): who noticed, how fast.

    Only the system's own events count: a step the demo's script took with its operator token (a cutover it
    posted) is the script noticing, not Lifeline.
    """
    for event in events:
        if not event.get("routing_tier") or str(event.get("actor") or "").startswith(f"token:{OPERATOR}#"):
            continue
        at = datetime.fromisoformat(event["started_at"].replace("Z", "+00:00"))
        if at.tzinfo is None:
            at = at.replace(tzinfo=UTC)
        if at < fault_wall:
            continue
        if about is not None and about not in _about(event):
            continue
        return (at - fault_wall).total_seconds()
    return None


def _about(event: dict[str, Any]) -> str:
    return f"{event.get('scope')} {event.get('after')} {event.get('reason')}"


def gateway_counter(region: Region, name: str) -> float:
    try:
        return region.gateway.metric(name)
    except httpx.HTTPError:
        return 0.0


def wait_until(condition: Callable[[], Any], what: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(0.1)
    raise TimeoutError(f"never: {what} (within {timeout:.0f} s)")


def _leased(fleet: DemoFleet, region: Region) -> set[str]:
    try:
        return set(region.gateway.leases())
    except httpx.HTTPError:
        return set()


# ---------------------------------------------------------------- the scenarios


@dataclass
class Context:
    fleet: DemoFleet
    region: Region
    traffic: Traffic
    reference: list[int]
    max_tokens: int
    kill_after: int
    paced: bool = True  # the victim's tokens can be paced through its fault admin (the reference engine's)


def _pinned_stream(ctx: Context, victim: PoolEngine, fault: Callable[[], None]) -> tuple[StreamRun, float, datetime]:
    """A stream pinned to `victim`; `fault` runs once `kill_after` tokens reached the client. (run, fault at, wall)."""
    fired: dict[str, Any] = {}
    # Pace the victim as drills do: unpaced, the tiny model can finish the whole stream into socket buffers
    # before the client has read `kill_after` tokens, and the fault would then miss the stream. Stock vLLM has
    # no such hook: its demo sends a longer stream instead (run.py, VLLM_MAX_TOKENS).
    if ctx.paced:
        victim.faults(token_delay_ms=PACE_MS)

    def on_token(run: StreamRun) -> None:
        if not fired and len(run.token_ids) >= ctx.kill_after:
            fired["at"], fired["wall"] = time.monotonic(), datetime.now(UTC)
            fault()

    run = stream(ctx.region.gateway.url, max_tokens=ctx.max_tokens, prefer=victim.instance_id, on_token=on_token)
    if not fired:
        raise RuntimeError(f"the stream pinned to {victim.instance_id} ended before the fault: {run.error}")
    return run, fired["at"], fired["wall"]


def _judge_stream(ctx: Context, run: StreamRun) -> tuple[bool, int, float | None]:
    """(token-identical and contiguous, token RPO against the reference, request RTO = largest gap at the client)."""
    reference = ctx.reference[:ctx.max_tokens]
    changed = sum(1 for a, b in zip(run.token_ids, reference) if a != b)
    missing = max(0, len(reference) - len(run.token_ids))
    duplicated = len(run.seqs) - len(set(run.seqs))
    contiguous = run.seqs == list(range(len(run.seqs)))
    gaps = [b - a for a, b in zip(run.arrivals, run.arrivals[1:])]
    return (run.token_ids == reference and contiguous and run.error is None, changed + missing + duplicated,
            max(gaps) if gaps else None)


def engine_kill(ctx: Context) -> Row:
    """SIGKILL the engine serving a long stream, mid-stream: the stream continues token-identical; the agent
    promotes a warm instance (a routing change) and backfills the zone."""
    fleet, region = ctx.fleet, ctx.region
    victim = fleet.engines(region, state="serving", zone=region.zones[0])[0]
    first = last_event_id(fleet)
    reprefilled = gateway_counter(region, "lifeline_gateway_reprefilled_tokens_total")
    run, fault_at, wall = _pinned_stream(ctx, victim, lambda: victim.kill())
    identical, rpo, gap = _judge_stream(ctx, run)
    # This stream's own migrations: its request epoch advances once per migration (the gateway's counter
    # also counts the steady streams that were on the victim).
    migrated = max(run.epochs, default=0)
    # A plan without warm instances (vLLM: two servers on this machine, both serving) has nothing to promote:
    # the other serving instance takes the load and the agent backfills the zone from cold.
    warm_planned = any(zone["warm"] for zone in region.plan.values())
    wait_until(lambda: len(fleet.engines(region, state="serving")) >= sum(z["serving"] for z in region.plan.values())
               and victim.instance_id not in _leased(fleet, region),
               "a warm instance promoted" if warm_planned else "the zone backfilled from cold",
               60 if warm_planned else fleet.pool_timeout)
    promoted_at = time.monotonic()
    layout = fleet.wait_pool(region, gone=[victim.instance_id])
    # The agent posts its events in batches after it acts: the gateways can see the promotion in the snapshot
    # before the event log does, so wait for the event rather than read the log at one instant.
    promoted = _events_of_kind(fleet, first, "pool.promoted", timeout=EVENT_FLUSH_S)
    events = events_since(fleet, first)
    row = Row("engine SIGKILL mid-stream", f"SIGKILL {victim.instance_id} after {ctx.kill_after} tokens")
    row.fault_at, row.ended_at = fault_at, time.monotonic()
    row.detection_s = detection(events, wall, about=victim.instance_id)
    row.request_rto_s = gap
    row.token_rpo = rpo
    row.rpo_context = int(gateway_counter(region, "lifeline_gateway_reprefilled_tokens_total") - reprefilled)
    row.rto_latency_s = ctx.traffic.rto_latency(fault_at, row.ended_at)
    row.requests_lost = ctx.traffic.lost(fault_at, row.ended_at) + (0 if run.error is None else 1)
    row.tiers = tiered(events)
    row.ok = identical and migrated == 1 and row.requests_lost == 0 and (bool(promoted) or not warm_planned)
    row.line = (f"SIGKILL {victim.instance_id} ({victim.zone}) after {ctx.kill_after} tokens: the stream went on "
                f"with {len(run.token_ids)} tokens; identical to reference: {mark(identical)}; seq "
                f"0..{len(run.seqs) - 1} contiguous: {mark(run.seqs == list(range(len(run.seqs))))}; migrations: "
                f"{migrated:.0f}; request RTO {fmt(gap)}; "
                + (f"the agent promoted {', '.join(_instance_of(e) for e in promoted) or 'nothing'} "
                   f"{fmt(promoted_at - fault_at)} after the kill and backfilled the zone" if warm_planned else
                   "no warm instance planned: the other serving one took the load; the agent backfilled the zone from cold "
                   f"({', '.join(_instance_of(e) for e in promoted) or 'nothing'} serving "
                   f"{fmt(promoted_at - fault_at)} after the kill)") + f": pool {_layout(layout)}")
    return row


def silent_hang(ctx: Context) -> Row:
    """Wedge an engine's decode loop (it still answers HTTP): the gateway's stall timeout moves the stream, the
    engine's watchdog fails /healthz/live, the agent takes its lease away and promotes a warm instance."""
    fleet, region = ctx.fleet, ctx.region
    victim = fleet.engines(region, state="serving", zone=region.zones[0])[0]
    first = last_event_id(fleet)
    reprefilled = gateway_counter(region, "lifeline_gateway_reprefilled_tokens_total")
    run, fault_at, wall = _pinned_stream(ctx, victim, lambda: victim.faults(token_delay_ms=PACE_MS, stall_step_after_tokens=0))
    identical, rpo, gap = _judge_stream(ctx, run)
    ejected = wait_until(lambda: victim.instance_id not in _leased(fleet, region) and time.monotonic(),
                         f"{victim.instance_id}'s lease released", 60)
    # The watchdog's verdict: /healthz/live turns 503 once the wedged step is older than the bound.
    watchdog_at, live = _wait_live_503(victim, timeout=STEP_STALL_BOUND_S + 15)
    try:
        victim.faults()  # cleared: the step finishes, the engine is live again and may serve after a fresh canary
        cleared = "fault cleared, the engine rejoined the pool"
    except httpx.HTTPError:  # on a loaded machine the agent may replace a warm instance that kept failing first
        cleared = "the agent had replaced the wedged engine before the fault was cleared; the pool"
    layout = fleet.wait_pool(region)
    events = events_since(fleet, first)
    row = Row("silent hang (decode loop wedged)", f"{victim.instance_id}'s decode loop blocked inside a step")
    row.fault_at, row.ended_at = fault_at, time.monotonic()
    row.detection_s = detection(events, wall, about=victim.instance_id)
    row.request_rto_s, row.token_rpo = gap, rpo
    row.rpo_context = int(gateway_counter(region, "lifeline_gateway_reprefilled_tokens_total") - reprefilled)
    row.rto_latency_s = ctx.traffic.rto_latency(fault_at, row.ended_at)
    row.requests_lost = ctx.traffic.lost(fault_at, row.ended_at) + (0 if run.error is None else 1)
    row.tiers = tiered(events)
    watchdog = watchdog_at is not None and live is not None and live.status_code == 503
    row.ok = identical and row.requests_lost == 0 and watchdog
    row.line = (f"{victim.instance_id}'s decode loop wedged after {ctx.kill_after} tokens (HTTP still answers): "
                f"the stream went on, identical to reference: {mark(identical)}; request RTO {fmt(gap)} (the "
                f"gateway's stall timeout); /healthz/live {live.status_code if live is not None else 'never'} "
                f"{_error_type(live) if live is not None else 'answered 503'} "
                f"{fmt(None if watchdog_at is None else watchdog_at - fault_at)} after the hang (watchdog: "
                f"{mark(watchdog)}); first noticed by {_first_kind(events, wall, victim.instance_id)}; lease released "
                f"{fmt(ejected - fault_at)} after the hang; {cleared}: {_layout(layout)}")
    return row


def corrupted_weights(ctx: Context) -> Row:
    """Corrupt one serving engine's weights in memory (it answers 200 everywhere): the canary ejects it."""
    fleet, region = ctx.fleet, ctx.region
    victim = fleet.engines(region, state="serving", zone=region.zones[-1])[0]
    first = last_event_id(fleet)
    reprefilled = gateway_counter(region, "lifeline_gateway_reprefilled_tokens_total")
    fault_at, wall = time.monotonic(), datetime.now(UTC)
    victim.faults(corrupt_weights=True)
    ejected = wait_until(lambda: victim.instance_id not in _leased(fleet, region) and time.monotonic(),
                         f"{victim.instance_id} ejected by the canary", 150)  # served traffic can postpone it long
    layout = fleet.wait_pool(region)

    def judged() -> list[dict[str, Any]]:
        return [e for e in events_since(fleet, first) if is_wrong_output_verdict(e, victim.instance_id)]

    # The agent ships its events in batches, and on a loaded machine the batch with the verdict can land after
    # the pool is whole again: wait for it (bounded) before judging the row on the system's own record.
    with contextlib.suppress(TimeoutError):
        wait_until(judged, f"the agent's wrong_output verdict on {victim.instance_id} in the event log", 30)
    events = events_since(fleet, first)
    verdicts = [e for e in events if e["kind"].endswith("probe.verdict") and victim.instance_id in str(e)]
    wrong = ctx.traffic.wrong(fault_at, ejected)
    row = Row("weights corrupted in memory", f"{victim.instance_id}'s output head shifted (health checks pass)")
    row.fault_at, row.ended_at = fault_at, time.monotonic()
    row.detection_s = detection(events, wall, about=victim.instance_id)
    row.token_rpo = sum(sum(1 for a, b in zip(r.token_ids, ctx.traffic.reference) if a != b) for r in wrong)
    row.rpo_context = int(gateway_counter(region, "lifeline_gateway_reprefilled_tokens_total") - reprefilled)
    row.rto_latency_s = ctx.traffic.rto_latency(fault_at, row.ended_at)
    row.requests_lost = ctx.traffic.lost(fault_at, row.ended_at)
    row.tiers = tiered(events)
    reason = next((str((e.get("after") or {}).get("verdict", "")) + ": " + e.get("reason", "") for e in verdicts
                   if "wrong_output" in str(e)), "")
    row.ok = bool(reason) and row.requests_lost == 0
    # docs/warm_pool.md: a corrupted engine "loses the lease it has within two canary rounds".
    bound = 2 / CANARY_PER_INSTANCE_PER_S * (1 + CANARY_JITTER) + 0.5  # + one probe interval's slack, rounded up
    if ejected - fault_at > bound:
        row.note = (f"{victim.instance_id} kept its lease {ejected - fault_at:.1f} s, past warm_pool's two canary "
                    f"rounds (≤ {bound:.1f} s here), serving {len(wrong)} wrong answers: served traffic (HTTP 200) "
                    "counts as its probe and postponed the canary")
    why = reason[:120] or "no wrong_output verdict seen"
    row.line = (f"corrupted {victim.instance_id}'s weights in memory: the canary failed it ({why}) and its lease went {fmt(ejected - fault_at)} after the fault; "
                f"{len(wrong)} steady answers served wrong before that ({row.token_rpo} tokens); the agent stopped "
                f"it and refilled the pool: {_layout(layout)}")
    return row


def zone_loss(ctx: Context, tiers: RealTiers) -> Row:
    """Every engine of a zone SIGKILLed mid-stream. The agent reports the zone fault and the control plane cuts
    the zone over on its own (anycast + mesh: BIRD shows the route withdrawn); with an agent that reports no
    faults the demo shifts the zone itself (l7 + anycast). The other zone's warm instance is promoted; once the
    zone is rebuilt the cutover is rolled back and the route comes back."""
    fleet, region = ctx.fleet, ctx.region
    zone = region.zones[0]
    scope = f"region:{region.name}/zone:{zone}"
    victims = fleet.engines(region, zone=zone)
    serving = next(e for e in victims if e in fleet.engines(region, state="serving"))
    first = last_event_id(fleet)
    known = {c["id"] for c in fleet.api("GET", "/cutovers", params={"scope": scope}).json()}
    announced_before = tiers.announcing() if tiers.bird else []
    reprefilled = gateway_counter(region, "lifeline_gateway_reprefilled_tokens_total")
    run, fault_at, wall = _pinned_stream(ctx, serving, lambda: [v.kill() for v in victims])
    identical, rpo, gap = _judge_stream(ctx, run)

    def automatic() -> list[dict[str, Any]] | None:
        found = [c for c in fleet.api("GET", "/cutovers", params={"scope": scope}).json() if c["id"] not in known]
        done = [c for c in found if c["state"] in ("completed", "failed", "rolled_back")]
        return done if done and len(done) == len(found) else None

    try:
        cutovers = wait_until(automatic, f"an automatic cutover of {zone}", 30)
        how = "the agent reported the zone fault; automatic"
        shift = None
    except TimeoutError:
        shift = fleet.api("POST", "/zonal-shifts", json={"region": region.name, "zone": zone, "expires_in": 600,
                                                         "reason": f"demo: {zone} lost"}).json()
        cutovers = [fleet.api("GET", f"/cutovers/{shift['cutover_id']}").json()]
        how = "no fault reported; the demo's zonal shift:"
    cutover_s = time.monotonic() - fault_at
    announced_during = tiers.announcing() if tiers.bird else []
    other = [z for z in region.zones if z != zone]
    promoted = wait_until(lambda: len([e for e in fleet.engines(region, state="serving") if e.zone in other]) >=
                          sum(region.plan[z]["serving"] for z in region.plan) and time.monotonic(),
                          f"{'/'.join(other)} serving the region's N alone", 90)
    layout = fleet.wait_pool(region, timeout=240, gone=[v.instance_id for v in victims])
    if shift is not None:
        fleet.api("DELETE", f"/zonal-shifts/{shift['id']}", params={"reason": f"demo: {zone} back"})
    else:
        for cutover in cutovers:
            if cutover["state"] == "completed":
                fleet.api("POST", f"/cutovers/{cutover['id']}/rollback", json={"reason": f"demo: {zone} rebuilt"})
    announced_after = (wait_until(lambda: zone in (a := tiers.announcing()) and a, f"{zone} announced again", 30)
                       if tiers.bird else [])
    layout = fleet.wait_pool(region, timeout=240)
    events = events_since(fleet, first)
    row = Row(f"zone loss ({zone})", f"every engine of {zone} SIGKILLed ({len(victims)})")
    row.fault_at, row.ended_at = fault_at, time.monotonic()
    row.rpo_context = int(gateway_counter(region, "lifeline_gateway_reprefilled_tokens_total") - reprefilled)
    row.detection_s = detection(events, wall)
    row.request_rto_s, row.token_rpo = gap, rpo
    row.rto_latency_s = ctx.traffic.rto_latency(fault_at, row.ended_at)
    row.requests_lost = ctx.traffic.lost(fault_at, row.ended_at) + (0 if run.error is None else 1)
    row.tiers = tiered(events)
    steps = [s["tier"] for c in cutovers for s in c["steps"]]
    withdrawn = not tiers.bird or (zone in announced_before and zone not in announced_during
                                   and zone in announced_after)
    row.ok = (identical and row.requests_lost == 0 and all(c["state"] == "completed" for c in cutovers)
              and withdrawn)
    bgp = (f"BIRD's paths to the anycast prefix: {announced_before} → {announced_during} → {announced_after}"
           if tiers.bird else "anycast recorded only (no BIRD/ExaBGP)")
    row.line = (f"{zone} lost ({len(victims)} engines SIGKILLed) mid-stream: the stream went on, identical: "
                f"{mark(identical)}, request RTO {fmt(gap)}; {how} cutover "
                f"{', '.join(str(c['id']) + ' ' + c['state'] for c in cutovers)} {cutover_s:.1f} s after the loss "
                f"(tiers {steps}); {bgp}; {'/'.join(other)} served the region's N alone "
                f"{fmt(promoted - fault_at)} after the loss; zone rebuilt, cutover rolled back: {_layout(layout)}")
    return row


def _wait_live_503(engine: PoolEngine, *, timeout: float) -> tuple[float | None, httpx.Response | None]:
    """When /healthz/live first answered 503 (monotonic) and that answer, or (None, None) within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if (response := oneshot_http.get(f"{engine.url}/healthz/live", timeout=2)).status_code == 503:
                return time.monotonic(), response
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    return None, None


def _error_type(response: httpx.Response) -> str:
    try:
        return str(response.json().get("error", {}).get("type", "")) if response.status_code != 200 else ""
    except ValueError:
        return ""


def _first_kind(events: list[dict[str, Any]], fault_wall: datetime, about: str) -> str:
    """Who noticed first: the first routing_tier event about `about` after the fault, with its reason."""
    for event in events:
        at = datetime.fromisoformat(event["started_at"].replace("Z", "+00:00"))
        if at.tzinfo is None:
            at = at.replace(tzinfo=UTC)
        if event.get("routing_tier") and at >= fault_wall and about in _about(event):
            return f"{event['kind']} ({str(event.get('reason', ''))[:60]})"
    return "nothing"


def _instance_of(event: dict[str, Any]) -> str:
    scope = str(event.get("scope", ""))
    return scope.rsplit(":", 1)[-1] if "instance" in scope else scope


def _layout(layout: dict[str, dict[str, int]]) -> str:
    return ", ".join(f"{z} {c['serving']}+{c['warm']}" for z, c in layout.items()) + " (serving+warm)"


def snapshot_line(fleet: DemoFleet) -> str:
    version = fleet.snapshot_version()
    reports = fleet.wait_applied(version)
    parts = []
    for region in fleet.regions.values():
        report = reports[region.gateway.replica_id]
        parts.append(f"{report['replica_id']} applied snapshot {report['snapshot_version']} "
                     f"(routing_source {report['routing_source']}; {len(report['live_endpoints'])} live)")
    return f"control plane serves snapshot {version}; " + "; ".join(parts)


def generated_tokens(url: str) -> float:
    try:
        return scrape_metric(f"{url}/metrics", "vllm:generation_tokens_total")
    except httpx.TransportError:
        return 0.0
