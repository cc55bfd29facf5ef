"""The demo's fleet: a served control plane and, per region, a gateway plus a regional agent keeping a warm pool.

Every part is a real process: `lifeline controlplane serve` (the embedded
default, SQLite in the work dir, tasks in-process), a private
`redis-server` on a spare loopback port (the regions' lease registries),
per region one `lifeline gateway serve` routing by the control plane's
snapshot and one `lifeline agent serve` whose `local` pool driver runs the
region's `lifeline engine serve` processes at the capacity plan's serving
and warm counts. The demo talks to them as an operator would: the control
plane's API (`/api/v1`), the gateways' OpenAI surface, an engine's fault
admin. It never starts or stops an engine itself; the agents do, and the
demo finds an instance's pid among its agent's children to SIGKILL it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from common import oneshot_http
from lifeline.daemons import DaemonMissing, RedisNode
from lifeline.demo import sessions
from lifeline.processes import LEASE_TOKEN, ControlPlaneProcess, GatewayProcess, free_port, wait_for_http_ok

MODEL = "tiny"
OPERATOR = "demo-operator"  # the token the demo's own script acts with: its steps are not the system's
# Each engine's decode-loop watchdog: a step older than this is a hang (/healthz/live 503). The engine's
# default (10 s) is sized for a 2048-token prefill on a loaded CPU; the demo's prompts are ~10 tokens.
STEP_STALL_BOUND_S = 3.0
# Routine canaries: each instance about every 2 s (production's 0.1/s budgets real traffic).
CANARY_PER_INSTANCE_PER_S = 0.5
CANARY_JITTER = 0.2


@dataclass
class PoolEngine:
    """One engine the region's agent runs, as the agent last reported it."""

    instance_id: str
    region: str
    zone: str
    url: str
    agent_pid: int

    def pid(self) -> int | None:
        """The engine's pid: the agent's child whose argv names this instance (the local driver's process).

        `lifeline engine serve` carries `--instance-id`; stock vLLM knows no instance ids, so its server is the
        child listening on this instance's port (`--port`, from its command template)."""
        port = self.url.rsplit(":", 1)[-1].encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if ppid != self.agent_pid:
                    continue
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except (OSError, IndexError, ValueError):
                continue
            if b"--instance-id" in argv and argv[argv.index(b"--instance-id") + 1] == self.instance_id.encode():
                return int(entry.name)
            if b"--instance-id" not in argv and b"--port" in argv and argv[argv.index(b"--port") + 1] == port:
                return int(entry.name)
        return None

    def kill(self, sig: int = signal.SIGKILL) -> bool:
        """Signal the engine's process group (the local driver gives each its own session), as a node loss
        would: vLLM's engine core is a child of its API server and must go with it."""
        pid = self.pid()
        if pid is None:
            return False
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except ProcessLookupError:
            return False
        return True

    def faults(self, **faults: Any) -> dict[str, Any]:
        """Set the engine's injected faults (`--enable-fault-admin`, POST /admin/faults); the new fault set."""
        response = oneshot_http.post(f"{self.url}/admin/faults", json=faults, timeout=10)
        response.raise_for_status()
        return response.json()


@dataclass
class AgentProcess:
    """`lifeline agent serve --config …` for one region; stopped with SIGTERM, which stops its pool."""

    config: dict[str, Any]
    workdir: Path
    process: subprocess.Popen | None = None

    @property
    def region(self) -> str:
        return str(self.config["region"])

    @property
    def log_path(self) -> Path:
        return self.workdir / f"agent-{self.region}.log"

    def start(self) -> None:
        path = self.workdir / f"agent-{self.region}.yaml"
        path.write_text(yaml.safe_dump(self.config))
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "lifeline.cli", "agent", "serve", "--region", self.region, "--config",
                 str(path)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if not self.alive():
            return
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


@dataclass
class Region:
    name: str
    zones: tuple[str, ...]
    plan: dict[str, dict[str, int]]  # zone → {serving, warm}, from `lifeline pool plan`
    gateway: GatewayProcess
    agent: AgentProcess


@dataclass
class DemoFleet:
    workdir: Path
    model_dir: Path
    drivers_file: Path | None = None
    engine: str = "reference"  # what the pools run: `reference` (lifeline engine serve) or `vllm` (stock vLLM)
    controlplane: ControlPlaneProcess = field(init=False)
    operator_token: str = ""
    gateway_token: str = ""
    agent_token: str = ""
    regions: dict[str, Region] = field(default_factory=dict)
    redis: RedisNode | None = None
    registry_url: str = ""
    registry_prefix: str = field(default_factory=lambda: f"demo-{uuid.uuid4().hex[:8]}")
    registry_note: str = ""
    replication: sessions.CeleryReplication | None = None
    _stray_pids: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.logs = self.workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        env = {"LIFELINE_CONTROLPLANE_DRILL_FLEET_FILE": str(self.fleet_file),
               "LIFELINE_CONTROLPLANE_DRILL_REPORT_DIR": str(self.workdir / "reports" / "drills")}
        if self.drivers_file is not None:
            env["LIFELINE_CONTROLPLANE_CUTOVER_DRIVERS_FILE"] = str(self.drivers_file)
            # Gateways report every second; a region cutover at l7 verifies on the region's fresh gateways and
            # waits out a dead one's last report as lagging until it turns stale (default 30 s: the step's
            # whole timeout). Three report intervals say "gone" soon enough for the region loss to measure.
            env["LIFELINE_CONTROLPLANE_GATEWAY_REPORT_STALE_AFTER"] = "PT3S"
        self.controlplane = ControlPlaneProcess(self.workdir, env=env)

    @property
    def pool_timeout(self) -> float:
        """How long a pool may take to reach its plan: a vLLM takes 20-90 s to start on two busy cores."""
        return 420.0 if self.engine == "vllm" else 180.0

    @property
    def fleet_file(self) -> Path:
        return self.workdir / "drill-fleet.yaml"

    # -- the lease registry ----------------------------------------------------------------
    def start_registry(self) -> str:
        """A private redis-server on a spare port (a real part); else the machine's on 6379 under our own prefix."""
        try:
            self.redis = RedisNode(self.workdir / "redis", free_port())  # kept first: close() stops a half-started one
            self.redis.start()
            self.registry_url = f"redis://127.0.0.1:{self.redis.port}/0"
            self.registry_note = f"redis-server on 127.0.0.1:{self.redis.port}, started by the demo"
        except DaemonMissing:
            self.redis = None
            if not _listening(6379):
                raise
            self.registry_url = "redis://127.0.0.1:6379/0"
            self.registry_note = f"the machine's Redis on 127.0.0.1:6379, keys under {self.registry_prefix}:"
        return self.registry_note

    # -- the control plane ---------------------------------------------------------------
    def start_controlplane(self) -> dict[str, Any]:
        """A fresh database: tokens, the model registered and promoted to `prod`, the API serving. Returns the version."""
        import shutil

        database = self.workdir / "controlplane.sqlite3"
        database.unlink(missing_ok=True)  # every run measures its own numbers from an empty history
        # Run ids and snapshot versions restart with the database: a gateway's cached snapshot from an
        # earlier run would carry a higher version and the gateway would refuse every new one as older.
        for stale in ("reports", "state"):
            shutil.rmtree(self.workdir / stale, ignore_errors=True)
        self.controlplane.migrate()
        cli = self.controlplane.cli
        self.operator_token = cli("controlplane", "token", "create", "--role", "operator", "--name", OPERATOR).split()[0]
        self.gateway_token = cli("controlplane", "token", "create", "--role", "gateway", "--name", "demo-gateways").split()[0]
        self.agent_token = cli("controlplane", "token", "create", "--role", "agent", "--name", "demo-agents").split()[0]
        cli("catalog", "register", MODEL, self.model_dir.name, str(self.model_dir))
        cli("catalog", "promote", MODEL, "prod", self.model_dir.name, "--reason", "demo")
        self.controlplane.start()
        self.controlplane.wait_ready(timeout=120)
        return self.api("GET", f"/catalog/models/{MODEL}/versions/{self.model_dir.name}").json()

    def pool_plan(self, region: str, zones: tuple[str, ...], demand: list[str]) -> dict[str, Any]:
        """`lifeline pool plan --json` for this region's zones and the given demand and instance capacity."""
        return json.loads(self.controlplane.cli("pool", "plan", "--region", region, "--zones", ",".join(zones),
                                                *demand, "--json"))

    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = oneshot_http.request(method, f"{self.controlplane.url}/api/v1{path}", timeout=60,
                                        headers={"Authorization": f"Bearer {self.operator_token}"}, **kwargs)
        if response.is_error:
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text[:500]}")
        return response

    def declare(self, region: str, zones: tuple[str, ...]) -> None:
        """The region, its zones and one cluster per zone serving the model (what a zonal shift drains)."""
        self.api("POST", "/regions", json={"name": region})
        for zone in zones:
            self.api("POST", f"/regions/{region}/zones", json={"name": zone})
            self.api("POST", "/clusters", json={"name": f"{zone}-{MODEL}", "region": region, "zone": zone,
                                                "model": MODEL, "weight": 100})

    def snapshot_version(self) -> int:
        return int(self.api("GET", "/snapshot").json()["version"])

    def gateway_reports(self) -> dict[str, dict[str, Any]]:
        return {g["replica_id"]: g for g in self.api("GET", "/gateways").json()}

    def wait_applied(self, version: int, timeout: float = 60.0, engines: dict[str, int] | None = None,
                     ) -> dict[str, dict[str, Any]]:
        """Until every gateway reports a snapshot at least `version` routing to its region's planned serving count."""
        deadline = time.monotonic() + timeout
        reports: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline:
            reports = self.gateway_reports()
            if all(_applied(reports.get(r.gateway.replica_id, {}), version,
                            r_serving(r) if engines is None else engines.get(r.name, 0))
                   for r in self.regions.values()):
                return reports
            time.sleep(0.2)
        raise TimeoutError(f"gateways never reported snapshot {version}: {reports}")

    # -- regions ---------------------------------------------------------------------------
    def start_region(self, name: str, zones: tuple[str, ...], plan: dict[str, dict[str, int]]) -> Region:
        """The region declared, its gateway (Redis registry, snapshot routing) and its agent with the planned pool."""
        self.declare(name, zones)
        replica = f"gw-{name}"
        state = self.workdir / "state"
        config = {
            "replica_id": replica,
            "region": name,
            "registry": {"kind": "redis", "url": self.registry_url, "key_prefix": self.registry_prefix,
                         "token": LEASE_TOKEN, "ttl": 2.0, "refresh_interval": 0.1},
            "recovery": {"stall_timeout": 2.0, "first_token_timeout": 30.0, "connect_timeout": 1.0},
            "routing": {"source": "snapshot", "controlplane_url": self.controlplane.url, "token": self.gateway_token,
                        "region": name, "poll_interval": 0.25, "cache_path": str(state / replica / "snapshot.json"),
                        "report_interval": 1.0, "event_flush_interval": 0.2},
            "sessions": {"store": str(sessions.sessions_dir(self.workdir, name))},
        }
        gateway = GatewayProcess(config, free_port(), self.logs, replica_id=replica)
        agent = AgentProcess({
            "region": name, "agent_id": f"agent-{name}", "controlplane_url": self.controlplane.url,
            "controlplane_token": self.agent_token, "snapshot_cache": str(state / f"agent-{name}" / "snapshot.json"),
            "snapshot_poll_interval": 0.5, "report_interval": 0.5,
            "registry": self.registry_url, "registry_prefix": self.registry_prefix, **self._probing(),
            "canary_per_instance_per_s": CANARY_PER_INSTANCE_PER_S, "canary_jitter": CANARY_JITTER,
            "pool": {"driver": "local", "model": MODEL, "alias": "prod",
                     "versions": {self.model_dir.name: str(self.model_dir)}, "zones": plan,
                     "state_dir": str(state / f"pool-{name}"), **self._engine_pool(name)},
        }, self.logs)
        (state / f"agent-{name}").mkdir(parents=True, exist_ok=True)
        region = self.regions[name] = Region(name, zones, plan, gateway, agent)  # before they start: close() stops them
        gateway.start()
        agent.start()
        return region

    def _probing(self) -> dict[str, float]:
        """The agent's lease and probe bounds. Two vLLMs streaming on two cores starve the agent's tick and slow
        the idle server's /health past 1.5 s: 2 s leases lapsed together there (the kill's stream then met a 503).
        A killed engine still loses its lease at the first refused probe, by release, not by the TTL."""
        if self.engine == "vllm":
            return {"lease_ttl": 10.0, "probe_interval": 0.25, "probe_timeout": 5.0}
        return {"lease_ttl": 2.0, "probe_interval": 0.25, "probe_timeout": 1.5}

    def _engine_pool(self, region: str) -> dict[str, Any]:
        """The pool's engine settings: `lifeline engine serve` flags, or stock vLLM's command template."""
        if self.engine == "vllm":
            from lifeline.vllm import pool_command

            # vLLM's own drain short (a retire stops an idle warm instance); the production command otherwise.
            return {"commands": {self.model_dir.name: pool_command(shutdown_timeout=5.0, unroute_wait=1.0)},
                    "start_timeout": self.pool_timeout}
        return {"engine_args": ["--enable-fault-admin", "--step-stall-bound", str(STEP_STALL_BOUND_S),
                                *sessions.ENGINE_ARGS, "--kv-checkpoint-store",
                                sessions.kv_store_url(self.workdir, region)]}

    def start_replication(self, source: str, destination: str) -> str:
        """The `chat` class's critical policy from `source` to `destination`, and a Celery worker + beat to run it."""
        self.api("PUT", "/replication/policies", json=sessions.policy(self.workdir, source, destination))
        broker = self.registry_url.rsplit("/", 1)[0] + "/1"  # the registry's Redis, another database
        self.replication = sessions.CeleryReplication(
            self.workdir, self.controlplane.environment()["LIFELINE_CONTROLPLANE_DATABASE_URL"], broker,
            f"{self.registry_prefix}-replication")
        return self.replication.start(self.logs)

    def agent_report(self, region: Region) -> dict[str, Any]:
        reports = self.api("GET", "/agents", params={"region": region.name}).json()
        return reports[0] if reports else {}

    def instances(self, region: Region) -> list[dict[str, Any]]:
        """The agent's last view of its region's instances (GET /api/v1/agents)."""
        return list(self.agent_report(region).get("instances", []))

    def engines(self, region: Region, *, state: str | None = None, zone: str | None = None) -> list[PoolEngine]:
        """The region's pool instances the agent reports (optionally only one pool state, one zone)."""
        assert region.agent.process is not None
        found = [PoolEngine(i["instance_id"], region.name, i["zone"], i["url"], region.agent.process.pid)
                 for i in self.instances(region) if i.get("origin") == "pool"
                 and (state is None or i.get("pool_state") == state) and (zone is None or i["zone"] == zone)]
        for engine in found:
            if (pid := engine.pid()) is not None:
                self._stray_pids.add(pid)
        return sorted(found, key=lambda e: (e.zone, e.instance_id))

    def pool_layout(self, region: Region, *, gone: Collection[str] = ()) -> dict[str, dict[str, int]]:
        """zone → {serving, warm} as the agent reports it, counting only instances whose canary passed.

        RuntimeError while the report still lists an instance of `gone`: it predates their loss.
        """
        layout = {zone: {"serving": 0, "warm": 0} for zone in region.zones}
        instances = self.instances(region)
        if stale := sorted({i["instance_id"] for i in instances} & set(gone)):
            raise RuntimeError(f"{region.name}: the agent's last report still lists {stale}")
        for i in instances:
            if i.get("origin") == "pool" and i.get("pool_state") in ("serving", "warm") and i.get("verdict") == "ok":
                layout.setdefault(i["zone"], {"serving": 0, "warm": 0})[i["pool_state"]] += 1
        return layout

    def wait_pool(self, region: Region, timeout: float | None = None, *,
                  gone: Collection[str] = ()) -> dict[str, dict[str, int]]:
        """Until the agent reports the planned pool and the gateway routes to every serving instance; after a
        loss, in a report that no longer lists the instances `gone` (one sent before it still counts them)."""
        timeout = self.pool_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        layout: dict[str, dict[str, int]] = {}
        while time.monotonic() < deadline:
            if not region.agent.alive():
                raise RuntimeError(f"agent {region.name} exited:\n{region.agent.log_path.read_text()[-3000:]}")
            try:
                layout = self.pool_layout(region, gone=gone)
            except RuntimeError:
                layout = {}
            if layout == region.plan and _routable(region.gateway) >= r_serving(region):
                return layout
            time.sleep(0.25)
        raise TimeoutError(f"{region.name}: the pool never matched the plan {region.plan}: {layout}")

    def wait_gateways(self, timeout: float = 120.0) -> None:
        for region in self.regions.values():
            wait_for_http_ok(f"{region.gateway.url}/healthz/live", region.gateway.process, name=region.gateway.replica_id,
                             log_path=region.gateway.log_path, timeout=timeout)

    def write_drill_fleet(self, region: Region) -> None:
        """The fleet file the control plane's drill task acts on: this region's gateway and its serving engines."""
        instances = {e.instance_id: {"url": e.url, "served_model": self.model_dir.name, "zone": e.zone}
                     for e in self.engines(region, state="serving")}
        self.fleet_file.write_text(yaml.safe_dump({
            "gateway_url": region.gateway.url, "region": region.name,
            "events": {"controlplane_url": self.controlplane.url, "token": self.operator_token},
            "instances": instances,
        }))

    def close(self) -> None:
        """Stop everything: the control plane first (a drill it runs must not outlive us), agents (and their
        pools), gateways, then any engine pid we ever saw that is still there, then the registry."""
        if self.controlplane.process is not None and self.controlplane.process.poll() is None:
            self.controlplane.process.send_signal(signal.SIGCONT)  # an outage drill may have left it stopped
        _each(self.controlplane.stop)
        for region in self.regions.values():
            _each(region.agent.stop)
        for region in self.regions.values():
            # SIGTERM drains; a gateway still draining streams after its grace is SIGKILLed (seen: 15 s and more
            # with steady traffic in flight), so one slow stop never leaves the rest running.
            _each(lambda g=region.gateway: g.kill(signal.SIGTERM), fallback=lambda g=region.gateway: g.kill())
        if self.replication is not None:
            _each(self.replication.stop)
        # Engines an agent started but did not stop: those of an agent that was SIGKILLed (the region-loss
        # scenario, a crash) live on in their own sessions. Each names this run's work dir in its argv.
        for pid in self._stray_pids | set(_engines_under(self.workdir)):
            try:
                if _is_our_engine(pid, self.workdir):  # its session too: a vLLM's engine core
                    os.killpg(pid, signal.SIGKILL) if os.getpgid(pid) == pid else os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.redis is not None:
            _each(self.redis.stop, fallback=self.redis.kill)


def _each(stop: Any, fallback: Any = None) -> None:
    """Run one stop step; on any failure run `fallback` (a SIGKILL), and go on with the next step regardless."""
    try:
        stop()
    except Exception:  # noqa: BLE001 - stopping must reach every process; the log keeps the rest
        if fallback is not None:
            try:
                fallback()
            except Exception:  # noqa: BLE001
                pass


def r_serving(region: Region) -> int:
    return sum(z["serving"] for z in region.plan.values())


def _routable(gateway: GatewayProcess) -> int:
    try:
        return int(oneshot_http.get(f"{gateway.url}/healthz/ready", timeout=1.0).json().get("routable_endpoints", {})
                   .get(MODEL, 0))
    except (httpx.HTTPError, ValueError):
        return 0


def _engines_under(workdir: Path) -> list[int]:
    """Pids of engine processes whose argv names `workdir` (their model and state dirs are in it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _is_our_engine(int(entry.name), workdir):
            found.append(int(entry.name))
    return found


def kill_agent_and_pool(agent: AgentProcess) -> int:
    """SIGKILL an agent and every engine it started, as a lost region loses them: freeze the agent first so it
    starts no more, kill its children, then it. Returns how many engines were killed."""
    if not agent.alive():
        return 0
    assert agent.process is not None
    agent.process.send_signal(signal.SIGSTOP)
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == agent.process.pid:
                children.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    agent.process.kill()
    agent.process.wait(timeout=10)
    return len(children)


def _is_our_engine(pid: int, workdir: Path) -> bool:
    """Still one of this run's engines (its argv names our work dir), not a pid reused by someone else's process:
    `lifeline engine serve`, or a stock vLLM server started from the pool's command template."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        return (b"engine\0serve" in argv or b"vllm.entrypoints.openai.api_server" in argv) \
            and str(workdir).encode() in argv
    except OSError:
        return False


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.3):
            return True
    except OSError:
        return False


def _applied(report: dict[str, Any], version: int, engines: int) -> bool:
    """A report that says the snapshot is applied and routes to at least `engines` engines."""
    return (report.get("snapshot_version") or 0) >= version and len(report.get("live_endpoints", [])) >= engines
