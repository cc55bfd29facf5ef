"""Whole cutovers per tier: execute → completed (write → verified), p50/p99 over N runs, against the seed's bands.

`bench/cutover_drivers.py` times the drivers alone; this times what an
operator (or the escalation ladder) waits for: `cutover.flows.execute` of a
planned cutover — the claim, the safety rules, reading and committing the
before-state, the write, the driver's verification against the real
system, the step's event, the final re-read of every step and the move to
`completed` — on a SQLite control-plane database built by `alembic
upgrade head`. Each run is rolled back before the next (timed too), with
the anti-flapping wait set to 0 so the same scope can be cut over again.

The systems are those of the driver bench (its daemons, reused): HAProxy's
runtime API, ExaBGP → BIRD 2, BIND9 (RFC 2136 + TSIG), moto's Route 53
emulator; plus the Kubernetes API emulator with istiod's status emulated
(`lifeline.kube_emulator`: no API server runs here) for Istio, and
Lifeline's own snapshot for l7 and mesh. The snapshot rows verify by the
snapshot version alone (no gateway reports here): gateways' poll interval
comes on top (bench/snapshot_propagation.py measures that).

One row is a whole cross-tier cutover: a zonal shift of zone-a
(`cutover.zonal_shift.start` → its cutover `completed`: the snapshot's l7
drain, the snapshot's mesh weights to 0, then ExaBGP's withdrawal verified
at BIRD, in that order), cancelled (rolled back, timed) before the next.
It is judged by its slowest tier's band (anycast: seconds).

For DNS a client sees the new answer only once its cached copy expires:
"client sees it by" adds the replaced answer's TTL (60 s, the short
external record of the dual TTL), which is what the seed's DNS band is about.

    .venv/bin/python -m bench.cutover [--runs 20] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.cutover_drivers import _pct, anycast_driver, bind_driver, haproxy_driver, istio_driver, route53_driver
from bench.docs import replace_section
from common.clock import SystemClock
from controlplane.db import build_engine, build_session_factory, session_scope
from cutover import flows, service as cutover_service, zonal_shift
from cutover.models import CutoverMode
from cutover.scope import Scope, ScopeKind, TargetState
from contract.routing_tier import RoutingTier
from cutover.policy import CutoverPolicy
from cutover.runtime import CutoverRuntime
from cutover.drivers.adapter import TierDriverAdapter
from cutover.drivers.step import StepDriver

HEADING = "## Whole cutovers per tier (bench/cutover.py)"
ZONE_A = Scope(ScopeKind.ZONE, "eu", "zone-a")
EU = Scope(ScopeKind.REGION, "eu", "eu")
ENGINE = Scope(ScopeKind.INSTANCE, "eu", "engine-7")
POLICY = CutoverPolicy(min_wait=timedelta(0), step_timeout=timedelta(seconds=10))

# tier → (the seed's band as written, the upper edge a p99 must stay under to beat it, in seconds)
BANDS = {
    RoutingTier.L7: ("milliseconds", 1.0),
    RoutingTier.MESH: ("sub-second", 1.0),
    RoutingTier.ANYCAST: ("seconds", 60.0),
    RoutingTier.DNS: ("30 s – 5 min incl. TTL", 300.0),
}


@dataclass
class Row:
    tier: RoutingTier
    system: str
    scope: Scope
    execute_s: list[float]
    effect_s: list[float]  # the driver's own write → verified, from the step's evidence
    rollback_s: list[float]
    client_cache_ttl_s: int | None


def _control_plane(workdir: Path) -> Any:
    """A migrated SQLite database with regions eu (zone-a, zone-b) and us (us-a), each zone one cluster of `m`."""
    from controlplane.schema import upgrade
    from controlplane.topology import service as topology
    from controlplane.topology.schemas import ClusterCreate

    url = f"sqlite:///{workdir / 'controlplane.sqlite3'}"
    upgrade(url)
    engine = build_engine(url)
    factory = build_session_factory(engine)
    clock = SystemClock()
    with session_scope(factory) as session:
        for region, zones in (("eu", ("zone-a", "zone-b")), ("us", ("us-a",))):
            topology.create_region(session, name=region, description="", actor="bench", clock=clock)
            for zone in zones:
                topology.create_zone(session, region=region, name=zone, actor="bench", clock=clock)
                topology.create_cluster(session, spec=ClusterCreate(name=f"c-{zone}", region=region, zone=zone,
                                                                    model="m", weight=100), actor="bench", clock=clock)
    return engine, factory, build_session_factory(engine, read_only=True)


def run_row(factory: Any, reads: Any, tier: RoutingTier, system: str, scope: Scope, driver: StepDriver,
            runs: int) -> Row:
    runtime = CutoverRuntime(factory=factory, clock=SystemClock(), drivers=[driver], policy=POLICY,
                             read_factory=reads)
    execute_s, effect_s, rollback_s = [], [], []
    ttl: int | None = None
    for i in range(runs):
        with session_scope(factory) as session:
            cutover, _ = cutover_service.plan(session, runtime, scope=scope, tiers=[tier],
                                              target_state=TargetState.OUT, reason="bench", mode=CutoverMode.MANUAL,
                                              actor="bench")
            cutover_id = cutover.id
        started = time.perf_counter()
        done = flows.execute(runtime, cutover_id=cutover_id, idempotency_key=f"bench-{i}", actor="bench")
        execute_s.append(time.perf_counter() - started)
        if done.state != "completed":
            raise SystemExit(f"{tier} {system}: cutover #{cutover_id} ended {done.state}: {done.failure}")
        evidence = done.steps[0].evidence or {}
        effect_s.append(float(evidence.get("time_to_effect_s", 0.0)))
        ttl = evidence.get("client_cache_ttl_s", ttl)
        started = time.perf_counter()
        back = flows.rollback(runtime, cutover_id=cutover_id, actor="bench", reason="bench: next run")
        rollback_s.append(time.perf_counter() - started)
        if back.state != "rolled_back":
            raise SystemExit(f"{tier} {system}: rollback of #{cutover_id} ended {back.state}")
    return Row(tier, system, scope, execute_s, effect_s, rollback_s, ttl)


def run_zonal_shift(factory: Any, reads: Any, drivers: list[StepDriver], runs: int) -> Row:
    """`zonal_shift.start` of zone-a until its cutover completed (every tier's step verified), then `cancel`."""
    runtime = CutoverRuntime(factory=factory, clock=SystemClock(), drivers=drivers, policy=POLICY,
                             read_factory=reads)
    execute_s, effect_s, rollback_s = [], [], []
    for _ in range(runs):
        started = time.perf_counter()
        shift = zonal_shift.start(runtime, region=ZONE_A.region, zone=ZONE_A.name, expires_in=timedelta(hours=1),
                                  reason="bench", actor="bench")
        execute_s.append(time.perf_counter() - started)
        with session_scope(reads) as session:
            cutover = cutover_service.get_or_raise(session, cutover_id=shift.cutover_id)
            tiers = [s.tier for s in cutover.steps]
            effect_s.append(sum(float((s.evidence or {}).get("time_to_effect_s", 0.0)) for s in cutover.steps))
            if cutover.state != "completed" or tiers != ["l7", "mesh", "anycast"]:
                raise SystemExit(f"zonal shift #{shift.id}: cutover #{cutover.id} ended {cutover.state} with "
                                 f"steps {tiers}: {cutover.failure}")
        started = time.perf_counter()
        ended = zonal_shift.cancel(runtime, shift_id=shift.id, actor="bench", reason="bench: next run")
        rollback_s.append(time.perf_counter() - started)
        if ended.end_reason != "cancelled":
            raise SystemExit(f"zonal shift #{shift.id} did not end by cancel: {ended.end_reason}")
    return Row(RoutingTier.ANYCAST, ZONAL_SHIFT_SYSTEM, ZONE_A, execute_s, effect_s, rollback_s, None)


ZONAL_SHIFT_SYSTEM = "zonal shift: l7 + mesh (snapshot), then ExaBGP → BIRD (3 steps)"


# ---------------------------------------------------------------- the tiers' drivers


@contextmanager
def snapshot_l7(factory: Any, reads: Any, workdir: Path) -> Iterator[StepDriver]:
    from cutover.drivers.snapshot_l7 import SnapshotL7Driver

    yield SnapshotL7Driver(factory, read_factory=reads, clock=SystemClock(), poll_interval_s=0.005)


@contextmanager
def haproxy(factory: Any, reads: Any, workdir: Path) -> Iterator[StepDriver]:
    with haproxy_driver(workdir) as (driver, states):
        target = states[0].target
        yield TierDriverAdapter(driver, tier=RoutingTier.L7, name="haproxy",
                                targets_for=lambda scope: [target] if scope == ENGINE else [])


@contextmanager
def snapshot_mesh(factory: Any, reads: Any, workdir: Path) -> Iterator[StepDriver]:
    """A 99/1 prod/canary route across zone-a and zone-b, written straight into the table (no catalog here)."""
    from controlplane.routing_version import service as routing_version
    from cutover.drivers.snapshot_mesh import SnapshotMeshDriver
    from controlplane.mesh_route.models import ANY, MeshRouteRecord

    clock = SystemClock()
    # Every session here ends before the driver is yielded: one held open across the yield kept SQLite's write
    # lock, and the zonal-shift row, which reuses the route, failed with "database is locked".
    with session_scope(reads) as session:
        written = session.query(MeshRouteRecord).filter_by(model="m").count()  # the zonal-shift row reuses it
    if not written:
        with session_scope(factory) as session:
            session.add(MeshRouteRecord(model="m", region=ANY, cohort=ANY, revision=1, reason="bench",
                                        updated_by="bench", updated_at=clock.utcnow(), destinations=[
                                            {"version": "v1", "zone": "zone-a", "weight": 50},
                                            {"version": "v1", "zone": "zone-b", "weight": 49},
                                            {"version": "v2", "zone": "zone-b", "weight": 1}]))
            routing_version.bump(session, clock=clock)
    yield SnapshotMeshDriver(factory, read_factory=reads, clock=clock, poll_interval_s=0.005)


@contextmanager
def istio(factory: Any, reads: Any, workdir: Path) -> Iterator[StepDriver]:
    with istio_driver(workdir) as (driver, states):
        target = states[0].target
        yield TierDriverAdapter(driver, tier=RoutingTier.MESH, name="istio",
                                targets_for=lambda scope: [target] if scope == ZONE_A else [])


@contextmanager
def anycast(factory: Any, reads: Any, workdir: Path) -> Iterator[StepDriver]:
    with anycast_driver(workdir) as (driver, states):
        target = states[0].target  # zone-a's announcement; zone-b keeps announcing
        yield TierDriverAdapter(driver, tier=RoutingTier.ANYCAST, name="exabgp",
                                targets_for=lambda scope: [target] if scope == ZONE_A else [])


def _dns_adapter(driver: Any, name: str, target: Any) -> StepDriver:
    from cutover.drivers.base import EXTERNAL_TTL_S
    from cutover.drivers_file import DnsRegion
    from cutover.runtime import dns_desired

    regions = {"eu": DnsRegion(answer=["192.0.2.10"], failover_to="us"),
               "us": DnsRegion(answer=["198.51.100.10"], failover_to="eu")}
    return TierDriverAdapter(driver, tier=RoutingTier.DNS, name=name, desired_for=dns_desired(regions, EXTERNAL_TTL_S),
                             targets_for=lambda scope: [target.model_copy(update={"scope": scope})] if scope == EU else [])


@contextmanager
def bind(factory: Any, reads: Any, workdir: Path) -> Iterator[StepDriver]:
    with bind_driver(workdir) as (driver, states):
        yield _dns_adapter(driver, "rfc2136", states[0].target)


@contextmanager
def route53(factory: Any, reads: Any, workdir: Path) -> Iterator[StepDriver]:
    with route53_driver(workdir) as (driver, states):
        yield _dns_adapter(driver, "route53", states[0].target)


ROWS: list[tuple[RoutingTier, str, Scope, Callable[..., Any]]] = [
    (RoutingTier.L7, "Lifeline snapshot: drain a zone's cluster", ZONE_A, snapshot_l7),
    (RoutingTier.L7, "HAProxy 2.6 runtime API: drain a server", ENGINE, haproxy),
    (RoutingTier.MESH, "Lifeline snapshot: zone's mesh weights to 0", ZONE_A, snapshot_mesh),
    (RoutingTier.MESH, "Istio VirtualService (emulated API server)", ZONE_A, istio),
    (RoutingTier.ANYCAST, "ExaBGP 5 → BIRD 2: withdraw the zone", ZONE_A, anycast),
    (RoutingTier.DNS, "BIND 9.18, RFC 2136 + TSIG: region's record", EU, bind),
    (RoutingTier.DNS, "Route 53 (moto emulator): region's record", EU, route53),
]


def report(runs: int, rows: list[Row]) -> str:
    ms = 1000.0
    lines = [
        f"{runs} cutovers per row (each rolled back before the next), x86_64, Python {platform.python_version()}, "
        "a shared 2-core machine, SQLite control-plane database, every daemon on loopback. *cutover* is "
        "`flows.execute` of a planned cutover until `completed` (claim, safety rules, before-state committed, write, "
        "verification at the real system, step event, final re-read of every step); *driver* is the step's own "
        "write → verified (`time_to_effect_s` in its evidence); *client sees it by* adds the TTL clients may still "
        "cache (DNS: the replaced answer's 60 s). The seed's band is beaten when that p99 is under its upper edge. "
        "The zonal shift row is one cutover across three tiers: *cutover* is `zonal_shift.start` until its cutover "
        "is completed, *driver* its three steps' write → verified summed, *rollback* its `cancel`.",
        "",
        "| tier | system | runs | driver p50 ms | cutover p50 ms | cutover p99 ms | rollback p50 ms "
        "| client sees it by (p99) | seed band | beats it |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        p99 = _pct(r.execute_s, 0.99)
        client = p99 + (r.client_cache_ttl_s or 0)
        band, edge = BANDS[r.tier]
        shown = f"{client:.1f} s" if r.client_cache_ttl_s else f"{client * ms:.1f} ms"
        tier = "l7 → mesh → anycast" if r.system == ZONAL_SHIFT_SYSTEM else r.tier.value
        lines.append(
            f"| {tier} | {r.system} | {len(r.execute_s)} | {statistics.median(r.effect_s) * ms:.1f} "
            f"| {statistics.median(r.execute_s) * ms:.1f} | {p99 * ms:.1f} | {statistics.median(r.rollback_s) * ms:.1f} "
            f"| {shown} | {band} | {'yes' if client < edge else 'no'} |")
    lines += [
        "",
        "Upper edges used: milliseconds < 1 s, sub-second < 1 s, seconds < 60 s, DNS ≤ 5 min. The write itself is "
        "milliseconds on every tier here; most of a whole cutover is the control plane's own commits (one unit of "
        "work per step, claim renewals, events) on SQLite. Not in these numbers: BGP propagation beyond the first "
        "router, gateways' snapshot poll interval (bench/snapshot_propagation.py), Envoy's xDS push to real "
        "proxies (the emulator's istiod reports at once), Route 53's PENDING → INSYNC (moto is immediate).",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--write", type=Path, help="replace this section of docs/benchmarks.md")
    parser.add_argument("--only", choices=[*(t.value for t in RoutingTier), "zonal-shift"], action="append",
                        help="run only these tiers, or the zonal-shift row (repeatable)")
    args = parser.parse_args()
    if args.runs < 20:
        parser.error("--runs must be at least 20 (p99 over fewer is meaningless)")
    if args.only and args.write:
        parser.error("--write replaces the whole section: run every row (no --only) to write it")
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="lifeline-cutover-bench-") as tmp:
        engine, factory, reads = _control_plane(Path(tmp))
        try:
            for index, (tier, system, scope, setup) in enumerate(ROWS):
                if args.only and tier.value not in args.only:
                    continue
                with ExitStack() as stack:
                    driver = stack.enter_context(setup(factory, reads, Path(tmp) / str(index)))
                    rows.append(run_row(factory, reads, tier, system, scope, driver, args.runs))
                print(f"{tier.value}: {system}: done", flush=True)
            if not args.only or "zonal-shift" in args.only:
                with ExitStack() as stack:
                    drivers = [stack.enter_context(setup(factory, reads, Path(tmp) / f"shift-{name}"))
                               for name, setup in (("l7", snapshot_l7), ("mesh", snapshot_mesh),
                                                   ("anycast", anycast))]
                    rows.append(run_zonal_shift(factory, reads, drivers, args.runs))
                print(f"zonal shift: {ZONAL_SHIFT_SYSTEM}: done", flush=True)
        finally:
            engine.dispose()
    table = report(args.runs, rows)
    print(table)
    if args.write:
        replace_section(args.write, HEADING, table)


if __name__ == "__main__":
    main()
