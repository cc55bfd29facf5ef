"""How Lifeline's costs grow with the fleet: simulated engines, real gateways, a real control plane on PostgreSQL.

One row per (engines, gateways). Each row is a fresh PostgreSQL database, a
real control plane (`lifeline controlplane serve`) with three regions of three
zones and one serving cluster per zone, two versions of one model (`prod` and
`canary`), `engines` simulated engines (`bench/fleet_sim.py`, one process per
region: the model is simulated, their leases in the regions' Redis
registries are real) and
`gateways` real gateway processes (`lifeline gateway serve`, routing by the
snapshot, dealt over the regions), started the way
`bench/snapshot_propagation.py` starts them (its `SnapshotFleet`). Measured:

- snapshot: `controlplane.snapshot.service.build_snapshot` + JSON on the row's
  database (median of 20), and the body's size raw and gzipped; the time the
  control plane takes to read a region's leases (`GET /regions/r1/instances`);
- a request: the median of 20 client-keyed 8-token completions through one
  gateway (its router orders the region's endpoints by consistent hashing);
- polling: control-plane CPU (user + system, `/proc` via psutil) over 10 s of
  gateways polling every 250 ms and reporting every 2 s, as % of one core;
- promote → every gateway: from a promote/rollback call's answer to the
  "snapshot applied" line (its own timestamp) of the last gateway; p50/p99
  over the moves; the table is swapped in that step, so it is "serving";
- a region's loss, twice. First with no agent running: the simulator stops
  renewing r1's leases and its engines answer 503; the time until every
  gateway of r1 routes to none of them (`/healthz/ready`), against the lease
  TTL (2 s). Gateways route only their own region's registry, so these are
  the gateways that could have routed to the lost engines. Then with one real
  regional agent per surviving region (`lifeline agent serve`, default
  settings): their CPU, the probe requests (health, identity, metrics) they
  sent per engine per second (flat while every tick fits `probe_interval`),
  and the loss of r2 with its agent running (its verdicts or the leases,
  whichever is first). Event-log rows per second in the 10 s after each loss;
- resident memory of each process.

    .venv/bin/python -m bench.fleet --engines 10,100,1000,10000 --gateways 2,10 [--moves 10] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import math
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TypeVar

import httpx
import psutil
import psycopg

from bench.docs import replace_section
from bench.snapshot_propagation import SnapshotFleet, _pct
from common import oneshot_http
from contract.identity import directory_weights_digest
from lifeline.processes import GatewayProcess, built_model, free_port, wait_for_http_ok

POSTGRES_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
REDIS_URL = "redis://127.0.0.1:6379/0"
REGIONS = ("r1", "r2", "r3")
ZONES = ("a", "b", "c")
MODEL = "tiny"
LEASE_TTL_S = 2.0
CPU_WINDOW_S = 10.0
HEADING = "## Fleet scale (bench/fleet.py)"
T = TypeVar("T")


@contextlib.contextmanager
def fresh_database() -> Iterator[str]:
    """A new, empty PostgreSQL database for one row (SQLAlchemy URL), dropped after it."""
    name = f"lifeline_fleet_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class Row:
    engines: int
    gateways: int
    snapshot_build_ms: float = math.nan
    snapshot_bytes: int = 0
    snapshot_gzip_bytes: int = 0
    instances_read_ms: float = math.nan  # GET /regions/{r}/instances: the control plane reading a region's leases
    controlplane_cpu_pct: float = math.nan
    gateway_cpu_pct: float = math.nan  # mean per gateway
    simulator_cpu_pct: float = math.nan
    agent_cpu_pct: float = math.nan  # mean per regional agent
    probes_per_s: float = math.nan  # health/identity/metrics requests the agents sent the fleet
    probes_per_engine_s: float = math.nan  # the same per engine: flat while the agents keep up
    request_ms: float = math.nan  # a client-keyed 8-token completion through one gateway, median
    promote_p50_ms: float = math.nan
    promote_p99_ms: float = math.nan
    lapse_max_s: float = math.nan  # no agents: the leases lapse and the registry forgets them
    lapse_events_per_s: float = math.nan
    agent_loss_max_s: float = math.nan  # agents running: their verdicts, or the leases, whichever is first
    agent_loss_events_per_s: float = math.nan
    controlplane_refusals: int = 0  # operator calls answered 503 and retried
    stage: str = ""  # "done", or the stage that failed and why (the columns after it are not measured)
    rss_mib: dict[str, float] = field(default_factory=dict)


@dataclass
class FleetRun:
    """One row's processes: the control plane and gateways of `SnapshotFleet`, and the engine simulators."""

    engines: int
    gateway_count: int
    workdir: Path
    database_url: str
    snapshot: SnapshotFleet = field(init=False)
    simulators: dict[str, subprocess.Popen] = field(default_factory=dict)  # one process per region
    sim_urls: dict[str, str] = field(default_factory=dict)
    agents: list[subprocess.Popen] = field(default_factory=list)
    model: Path = field(init=False)
    refusals: int = 0  # operator calls the control plane answered 503 (overloaded), each retried after a second

    def __post_init__(self) -> None:
        model = self.model = built_model(MODEL, 0)
        # Two version names over one artifact directory: the simulated engines, not the weights, tell them apart.
        self.snapshot = SnapshotFleet(self.workdir, {"v0": model, "v1": model})
        self.snapshot.controlplane.env["LIFELINE_CONTROLPLANE_DATABASE_URL"] = self.database_url

    # -- start-up ----------------------------------------------------------------------------------------------
    def start(self) -> None:
        self.snapshot.start_controlplane({"prod": "v0", "canary": "v1"})
        for region in REGIONS:
            self.snapshot.api("POST", "/regions", json={"name": region})
            for zone in ZONES:
                self.snapshot.api("POST", f"/regions/{region}/zones", json={"name": f"{region}-{zone}"})
                self.snapshot.api("POST", "/clusters", json={"name": f"{region}-{zone}-{MODEL}", "region": region,
                                                             "zone": f"{region}-{zone}", "model": MODEL})
        self.start_simulator()

    def start_simulator(self) -> None:
        """One simulator process per region, each with its share of the engines (one process renewing 10,000
        leases twice a TTL did not keep up on this machine)."""
        digest = directory_weights_digest(self.model)  # what the catalog recorded for both versions
        for n, region in enumerate(REGIONS):
            port = free_port()
            self.sim_urls[region] = f"http://127.0.0.1:{port}"
            count = self.engines // len(REGIONS) + (1 if n < self.engines % len(REGIONS) else 0)
            with open(self.workdir / f"fleet_sim-{region}.log", "ab") as log:
                self.simulators[region] = subprocess.Popen(
                    [sys.executable, "-m", "bench.fleet_sim", "--port", str(port), "--engines", str(count),
                     "--regions", region, "--zones", ",".join(ZONES),
                     "--versions", ",".join(f"{v}={digest}" for v in ("v0", "v1")),
                     "--redis-url", REDIS_URL, "--key-prefix", self.snapshot.key_prefix, "--ttl", str(LEASE_TTL_S)],
                    stdout=log, stderr=subprocess.STDOUT)
        for region, url in self.sim_urls.items():
            log_path = self.workdir / f"fleet_sim-{region}.log"
            wait_for_http_ok(f"{url}/admin/fleet", self.simulators[region], name=f"fleet simulator {region}",
                             log_path=log_path, timeout=300)
        deadline = time.monotonic() + 300
        while self.fleet_status()["registered"] < self.engines:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the simulators registered too few of {self.engines} engines in 300 s")
            time.sleep(0.5)

    def fleet_status(self) -> dict[str, int]:
        """The simulators' counters, summed."""
        answers = [oneshot_http.get(f"{url}/admin/fleet", timeout=10).json() for url in self.sim_urls.values()]
        return {key: sum(a[key] for a in answers) for key in ("engines", "registered", "lost", "probes_served")}

    def start_gateways(self) -> list[GatewayProcess]:
        gateways = []
        for n in range(self.gateway_count):
            replica_id = f"gw-{n:03d}"
            config = {**self.snapshot.gateway_config(replica_id), "region": REGIONS[n % len(REGIONS)]}
            # The defaults a deployment gets (lease view re-read every 250 ms, a report every 2 s), not the
            # propagation bench's faster ones.
            config["registry"] = {k: v for k, v in config["registry"].items() if k != "refresh_interval"}
            config["routing"] = {k: v for k, v in config["routing"].items() if k != "report_interval"}
            gateway = GatewayProcess(config, free_port(), self.workdir, replica_id=replica_id)
            gateway.start()
            gateways.append(gateway)
        self.snapshot.gateways = gateways
        for gateway in gateways:
            gateway.wait_live(timeout=600)
        return gateways

    def start_agents(self, regions: tuple[str, ...]) -> None:
        """One real regional agent per region (`lifeline agent serve`), probing the region's simulated engines."""
        token = self.snapshot.controlplane.create_token("agent", "fleet-agents")
        for region in regions:
            config = self.workdir / f"agent-{region}.yaml"
            config.write_text(json.dumps({"registry_prefix": self.snapshot.key_prefix, "agent_id": f"agent-{region}",
                                          "snapshot_cache": str(self.workdir / f"agent-{region}.json")}))
            with open(self.workdir / f"agent-{region}.log", "ab") as log:
                self.agents.append(subprocess.Popen(
                    [sys.executable, "-m", "lifeline.cli", "agent", "serve", "--region", region, "--config", str(config),
                     "--controlplane", self.snapshot.cp_url, "--controlplane-token", token, "--registry", REDIS_URL,
                     "--port", "0"], stdout=log, stderr=subprocess.STDOUT))

    def probes_served(self) -> int:
        return self.fleet_status()["probes_served"]

    def close(self) -> None:
        for agent in self.agents:
            agent.kill()
            agent.wait(timeout=15)
        self.snapshot.close()
        for simulator in self.simulators.values():
            simulator.kill()
            simulator.wait(timeout=15)

    # -- what a row measures -----------------------------------------------------------------------------------
    def measure_snapshot(self, row: Row, repeats: int = 20) -> None:
        """The control plane's own build (its code, on this row's database, in this process) and the body's size."""
        from controlplane.db import build_engine, build_session_factory
        from controlplane.snapshot import service

        engine = build_engine(self.database_url)
        took = []
        with build_session_factory(engine)() as session:
            for _ in range(repeats):
                start = time.perf_counter()
                body = service.build_snapshot(session).model_dump_json().encode()
                took.append(time.perf_counter() - start)
        engine.dispose()
        row.snapshot_build_ms = statistics.median(took) * 1000
        row.snapshot_bytes = len(body)
        row.snapshot_gzip_bytes = len(gzip.compress(body))
        took = []
        with httpx.Client(headers=self.snapshot.operator, timeout=60) as client:
            for _ in range(5):
                start = time.perf_counter()
                client.get(f"{self.snapshot.cp_url}/api/v1/regions/{REGIONS[0]}/instances").raise_for_status()
                took.append(time.perf_counter() - start)
        row.instances_read_ms = statistics.median(took) * 1000

    def measure_polling_cpu(self, row: Row, gateways: list[GatewayProcess]) -> None:
        """10 s of gateways polling and reporting, nothing else happening: what each process spends."""
        share = cpu_shares({"controlplane": [self.snapshot.controlplane.process], "simulator": list(self.simulators.values()),
                            "gateway": [g.process for g in gateways]})
        row.controlplane_cpu_pct = share["controlplane"][0]
        row.simulator_cpu_pct = sum(share["simulator"])
        row.gateway_cpu_pct = statistics.mean(share["gateway"])
        row.rss_mib = {"controlplane": _rss_mib(self.snapshot.controlplane.process),
                       "simulator": sum(_rss_mib(p) for p in self.simulators.values()),
                       "gateway (max)": max(_rss_mib(g.process) for g in gateways)}

    def measure_agents(self, row: Row, regions: tuple[str, ...]) -> None:
        """Agents for `regions`, after their start-up: their CPU, and the probes their engines answered."""
        self.start_agents(regions)
        time.sleep(CPU_WINDOW_S)  # start-up and the first probe of every engine
        probes_before = self.probes_served()
        share = cpu_shares({"agent": self.agents})
        row.probes_per_s = (self.probes_served() - probes_before) / CPU_WINDOW_S
        row.probes_per_engine_s = row.probes_per_s / (self.engines * len(regions) / len(REGIONS))
        row.agent_cpu_pct = statistics.mean(share["agent"])
        row.rss_mib["agent (max)"] = max(_rss_mib(a) for a in self.agents)

    def measure_requests(self, row: Row, gateway: GatewayProcess, count: int = 20) -> None:
        """Client-keyed completions through `gateway` (the router picks by consistent hashing over its region)."""
        took = []
        with httpx.Client(timeout=60) as client:
            for n in range(count):
                body = {"model": MODEL, "prompt": "How do costs grow?", "max_tokens": 8, "user": f"client-{n}"}
                start = time.perf_counter()
                client.post(f"{gateway.url}/v1/completions", json=body).raise_for_status()
                took.append(time.perf_counter() - start)
        row.request_ms = statistics.median(took) * 1000

    def operator(self, call: Callable[[], T]) -> T:
        """An operator's call, tried again while the control plane answers 503 (it does at 100 gateways here)."""
        for _ in range(30):
            try:
                return call()
            except RuntimeError as exc:
                if ": 503 " not in str(exc):
                    raise
                self.refusals += 1
                time.sleep(1.0)
        return call()

    def measure_promotes(self, row: Row, gateways: list[GatewayProcess], moves: int) -> None:
        every = []
        for move in range(moves):
            time.sleep(0.4)
            if move % 2 == 0:
                self.operator(lambda: self.snapshot.promote("prod", "v1"))
            else:
                self.operator(lambda: self.snapshot.rollback("prod"))
            answered = time.time()
            version = self.operator(self.snapshot.snapshot_version)
            applied = [applied_at(g, version, timeout=60) for g in gateways]
            every.append(max(applied) - answered)
        row.promote_p50_ms = statistics.median(every) * 1000
        row.promote_p99_ms = _pct(every, 0.99) * 1000

    def lose_region(self, gateways: list[GatewayProcess], region: str) -> tuple[float, float]:
        """Lose `region`'s engines: (seconds until each of its gateways routes to none of them, event rows/s in the
        CPU_WINDOW_S after the loss)."""
        local = [g for n, g in enumerate(gateways) if REGIONS[n % len(REGIONS)] == region]
        if min(routable_endpoints(g) for g in local) == 0:
            raise RuntimeError(f"the gateways of {region} routed to nothing before the loss")
        events_before = self.event_rows()
        lost_at = time.time()
        oneshot_http.post(f"{self.sim_urls[region]}/admin/regions/{region}/lose", timeout=10).raise_for_status()
        pending = {g.replica_id: g for g in local}
        gone_after: list[float] = []
        while pending and time.time() - lost_at < 10 * LEASE_TTL_S:
            for replica_id, gateway in list(pending.items()):
                if routable_endpoints(gateway) == 0:
                    gone_after.append(time.time() - lost_at)
                    del pending[replica_id]
            time.sleep(0.05)
        time.sleep(max(0.0, CPU_WINDOW_S - (time.time() - lost_at)))
        events = (self.event_rows() - events_before) / (time.time() - lost_at)
        return (math.inf if pending else max(gone_after)), events

    def event_rows(self) -> int:
        with psycopg.connect(self.database_url.replace("postgresql+psycopg://", "postgresql://", 1)) as conn:
            return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])


def applied_at(gateway: GatewayProcess, version: int, *, timeout: float) -> float:
    """Unix time of the gateway's "snapshot applied" log line for `version` or later (its own timestamp)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in gateway.logs().splitlines():
            if '"snapshot applied"' not in line:
                continue
            record = json.loads(line)
            if int(record["version"]) >= version:
                return datetime.fromisoformat(record["timestamp"]).timestamp()
        time.sleep(0.05)
    raise TimeoutError(f"{gateway.replica_id} never applied snapshot {version}:\n{gateway.logs()[-2000:]}")


def routable_endpoints(gateway: GatewayProcess) -> int:
    body = oneshot_http.get(f"{gateway.url}/healthz/ready", timeout=5.0).json()
    return sum(body.get("routable_endpoints", {}).values())


def cpu_shares(processes: dict[str, list[subprocess.Popen | None]]) -> dict[str, list[float]]:
    """Each process's CPU over the next CPU_WINDOW_S seconds, in % of one core."""
    before = {name: [_cpu_seconds(p) for p in procs] for name, procs in processes.items()}
    time.sleep(CPU_WINDOW_S)
    after = {name: [_cpu_seconds(p) for p in procs] for name, procs in processes.items()}
    return {name: [(a - b) / CPU_WINDOW_S * 100 for a, b in zip(after[name], before[name], strict=True)]
            for name in processes}


def _cpu_seconds(process: subprocess.Popen | None) -> float:
    times = psutil.Process(process.pid).cpu_times()  # type: ignore[union-attr]
    return times.user + times.system


def _rss_mib(process: subprocess.Popen | None) -> float:
    return psutil.Process(process.pid).memory_info().rss / 2**20  # type: ignore[union-attr]


def run_row(engines: int, gateways: int, moves: int) -> Row:
    row = Row(engines, gateways)
    with tempfile.TemporaryDirectory(prefix="fleetbench-") as tmp, fresh_database() as database_url:
        run = FleetRun(engines, gateways, Path(tmp), database_url)
        try:
            row.stage = "start"
            run.start()
            run.measure_snapshot(row)
            row.stage = "gateways"
            started = run.start_gateways()
            version = run.operator(run.snapshot.snapshot_version)
            for gateway in started:
                applied_at(gateway, version, timeout=120)
            row.stage = "polling"
            run.measure_polling_cpu(row, started)
            row.stage = "requests"
            run.measure_requests(row, started[0])
            row.stage = "promotes"
            run.measure_promotes(row, started, moves)
            row.stage = "region loss"
            row.lapse_max_s, row.lapse_events_per_s = run.lose_region(started, REGIONS[0])
            run.measure_agents(row, REGIONS[1:])
            row.agent_loss_max_s, row.agent_loss_events_per_s = run.lose_region(started, REGIONS[1])
            row.stage = "done"
        except Exception as exc:  # noqa: BLE001 - keep what was measured before the stage that failed
            row.stage = f"failed at {row.stage}: {exc!r}"[:300]
        finally:
            row.controlplane_refusals = run.refusals
            run.close()
    print(json.dumps(row.__dict__), flush=True)
    return row


def slope(rows: list[Row], cost: str) -> float:
    """The log–log slope of `cost` against engines (1: linear, 2: quadratic); NaN with fewer than two sizes."""
    points = [(math.log(r.engines), math.log(v)) for r in rows if (v := getattr(r, cost)) > 0 and math.isfinite(v)]
    if len({x for x, _ in points}) < 2:
        return math.nan
    return statistics.linear_regression([x for x, _ in points], [y for _, y in points]).slope


# (field of Row, column heading, format)
COLUMNS = (
    ("snapshot_build_ms", "snapshot ms", "{:.1f}"),
    ("snapshot_gzip_bytes", "snapshot gzip B", "{:.0f}"),
    ("instances_read_ms", "observed instances ms", "{:.1f}"),
    ("controlplane_cpu_pct", "control plane CPU %", "{:.1f}"),
    ("gateway_cpu_pct", "gateway CPU % (mean)", "{:.1f}"),
    ("simulator_cpu_pct", "simulators CPU % (sum)", "{:.1f}"),
    ("agent_cpu_pct", "agent CPU % (mean)", "{:.1f}"),
    ("probes_per_s", "probes/s sent", "{:.0f}"),
    ("probes_per_engine_s", "probes/s per engine", "{:.2f}"),
    ("request_ms", "request ms", "{:.0f}"),
    ("promote_p50_ms", "promote p50 ms", "{:.0f}"),
    ("promote_p99_ms", "promote p99 ms", "{:.0f}"),
    ("lapse_max_s", "leases lapse → unrouted s", "{:.2f}"),
    ("lapse_events_per_s", "events/s", "{:.1f}"),
    ("agent_loss_max_s", "with agents → unrouted s", "{:.2f}"),
    ("agent_loss_events_per_s", "events/s with agents", "{:.1f}"),
    ("controlplane_refusals", "503s to the operator", "{:.0f}"),
)


RSS_COLUMNS = ("controlplane", "gateway (max)", "agent (max)", "simulator")


def report(rows: list[Row]) -> str:
    lines = [
        (f"One row per (engines, gateways), {platform.processor() or platform.machine()}, Python "
         f"{platform.python_version()}, on a 2-core machine shared with another engineer's vLLM tests (the wall-clock "
         "columns are noisy; CPU columns are each process's own). Engines are simulated (`bench/fleet_sim.py`: the "
         "model is a hash, everything they say on the wire is the reference engine's shape, their leases are real "
         "Redis leases); the control plane (PostgreSQL), the gateways and the regional agents are the real "
         "processes. Three regions of three zones; a region's gateways and agent see a third of the engines. CPU % "
         "is of one core over 10 s; \"request\" is a client-keyed 8-token completion through one gateway; "
         "\"promote\" is a promote or rollback call's answer → the last gateway's \"snapshot applied\" (10 moves; "
         "6 at 100 gateways); \"leases lapse\" is a region's engines gone with no agent running → every gateway of "
         "the region routes to none of them (lease TTL 2 s); \"with agents\" is another region lost with its agent "
         "running. **slope** is the least-squares slope of log(cost) against log(engines) at that gateway count: "
         "1 is linear, 0 flat. The list of what was fixed, with numbers before and after, follows the table."),
        "","| engines | gateways | " + " | ".join(h for _, h, _ in COLUMNS) + " | RSS MiB cp / gw max / agent max / sims |",
             "|---:|---:|" + "---:|" * len(COLUMNS) + "---|"]
    for row in sorted(rows, key=lambda r: (r.gateways, r.engines)):
        cells = [fmt.format(getattr(row, name)) for name, _, fmt in COLUMNS]
        rss = " / ".join(f"{row.rss_mib.get(k, math.nan):.0f}" for k in RSS_COLUMNS)
        lines.append(f"| {row.engines} | {row.gateways} | " + " | ".join(cells) + f" | {rss} |")
    for gateways in sorted({r.gateways for r in rows}):
        same = [r for r in rows if r.gateways == gateways and r.stage in ("", "done")]
        slopes = [f"{slope(same, name):.2f}" for name, _, _ in COLUMNS]
        lines.append(f"| **slope** | {gateways} | " + " | ".join(slopes) + " | |")
    unfinished = [r for r in rows if r.stage not in ("", "done")]
    if unfinished:
        lines.append("")
        lines += [f"- {r.engines} engines, {r.gateways} gateways: {r.stage}; the columns of that stage and after "
                  "it are not measured (nan), and the row is left out of the slopes." for r in unfinished]
    return "\n".join(lines)


def plot(rows: list[Row], path: Path) -> None:
    """Four costs against engines, log–log, one line per gateway count; a small PNG for the docs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    costs = ("snapshot_build_ms", "controlplane_cpu_pct", "promote_p99_ms", "gateway_cpu_pct")
    figure, axes = plt.subplots(1, len(costs), figsize=(12, 3), dpi=80)
    for axis, cost in zip(axes, costs, strict=True):
        for gateways in sorted({r.gateways for r in rows}):
            same = sorted((r for r in rows if r.gateways == gateways and getattr(r, cost) > 0), key=lambda r: r.engines)
            axis.loglog([r.engines for r in same], [getattr(r, cost) for r in same], marker="o", label=f"{gateways} gw")
        axis.set_title({n: h for n, h, _ in COLUMNS}[cost], fontsize=9)
        axis.set_xlabel("engines", fontsize=8)
        axis.tick_params(labelsize=7)
    axes[0].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="10,100,1000", help="fleet sizes, comma-separated")
    parser.add_argument("--gateways", default="2", help="gateway counts, comma-separated")
    parser.add_argument("--moves", type=int, default=10)
    parser.add_argument("--results", type=Path, default=Path("var/fleet-results.jsonl"),
                        help="each row is appended here as a JSON line (the doc is rendered from it)")
    parser.add_argument("--render-only", action="store_true", help="measure nothing; render --results")
    parser.add_argument("--write", type=Path, help="replace this section of docs/benchmarks.md (and its figure)")
    args = parser.parse_args()
    if not args.render_only:
        for gateways in map(int, args.gateways.split(",")):
            for engines in map(int, args.engines.split(",")):
                try:
                    row = run_row(engines, gateways, args.moves)
                except Exception as exc:  # noqa: BLE001 - one size that cannot run here must not cost the others
                    print(f"{engines} engines, {gateways} gateways: not measured: {exc!r}"[:2000], flush=True)
                    continue
                args.results.parent.mkdir(parents=True, exist_ok=True)
                with args.results.open("a") as out:
                    out.write(json.dumps(row.__dict__) + "\n")
    rows = [Row(**json.loads(line)) for line in args.results.read_text().splitlines() if line.strip()]
    table = report(rows)
    print(table)
    if args.write:
        plot(rows, args.write.parent / "fleet_scale.png")
        replace_section(args.write, HEADING, table + "\n\n![costs against fleet size](fleet_scale.png)")


if __name__ == "__main__":
    main()
