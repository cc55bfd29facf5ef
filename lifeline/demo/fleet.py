"""The demo's fleet: a served control plane, and per region one gateway routing by its snapshot plus engines per zone.

Every part is a real `lifeline …` process started through
`lifeline.processes`; the demo talks to them as an operator would, over the
control plane's API (`/api/v1`) and the gateways' OpenAI surface. The
control plane is the embedded default (SQLite in the work dir, tasks
in-process), so nothing beyond Python is needed.

Engines renew their leases against their region's gateway (its in-process
registry): the regional agent's warm pool needs a Redis registry, which the
embedded default does not have (docs/demo.md says what that leaves out).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from lifeline.processes import (
    LEASE_TOKEN,
    ControlPlaneProcess,
    EngineProcess,
    GatewayProcess,
    free_port,
    wait_for_http_ok,
)

MODEL = "tiny"


@dataclass
class Engine:
    """One engine process, where it stands, and a pid file a drill's fleet file can kill it by."""

    process: EngineProcess
    region: str
    zone: str

    @property
    def instance_id(self) -> str:
        return self.process.instance_id

    @property
    def url(self) -> str:
        return self.process.url

    @property
    def pid_file(self) -> Path:
        return self.process.state_dir.parent / f"{self.instance_id}.pid"

    def command(self) -> list[str]:
        """The argv that starts this engine (what a drill's restart runs too)."""
        p = self.process
        return [sys.executable, "-m", "lifeline.cli", "engine", "serve", "--model", str(p.model), "--port", str(p.port),
                "--instance-id", p.instance_id, "--state-dir", str(p.state_dir), "--torch-threads", "1",
                *p.extra_args]

    def start(self) -> None:
        self.process.state_dir.mkdir(parents=True, exist_ok=True)
        self.process.start()
        self.pid_file.write_text(str(self.process.process.pid))  # type: ignore[union-attr]

    def pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Kill whichever process serves this instance now: ours, or one a drill restarted."""
        self.process.kill(sig)
        pid = self.pid()
        if pid is not None:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


@dataclass
class Region:
    name: str
    zones: tuple[str, ...]
    gateway: GatewayProcess
    engines: list[Engine] = field(default_factory=list)

    def engine(self, instance_id: str) -> Engine:
        return next(e for e in self.engines if e.instance_id == instance_id)


@dataclass
class DemoFleet:
    workdir: Path
    model_dir: Path
    controlplane: ControlPlaneProcess = field(init=False)
    operator_token: str = ""
    gateway_token: str = ""
    regions: dict[str, Region] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.logs = self.workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.controlplane = ControlPlaneProcess(self.workdir, env={
            "LIFELINE_CONTROLPLANE_DRILL_FLEET_FILE": str(self.fleet_file),
            "LIFELINE_CONTROLPLANE_DRILL_REPORT_DIR": str(self.workdir / "reports"),
        })

    @property
    def fleet_file(self) -> Path:
        return self.workdir / "drill-fleet.yaml"

    # -- the control plane ---------------------------------------------------------------
    def start_controlplane(self) -> dict[str, Any]:
        """A fresh database: tokens, the model registered and promoted to `prod`, the API serving. Returns the version."""
        database = self.workdir / "controlplane.sqlite3"
        database.unlink(missing_ok=True)  # every run measures its own numbers from an empty history
        # Run ids and snapshot versions restart with the database: a gateway's cached snapshot from an
        # earlier run would carry a higher version and the gateway would refuse every new one as older.
        for stale in ("reports", "state"):
            shutil.rmtree(self.workdir / stale, ignore_errors=True)
        self.controlplane.migrate()
        cli = self.controlplane.cli
        self.operator_token = cli("controlplane", "token", "create", "--role", "operator", "--name", "demo-operator").split()[0]
        self.gateway_token = cli("controlplane", "token", "create", "--role", "gateway", "--name", "demo-gateways").split()[0]
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
        response = httpx.request(method, f"{self.controlplane.url}/api/v1{path}", timeout=60,
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

    def wait_applied(self, version: int, timeout: float = 60.0, engines: int | None = None) -> dict[str, dict[str, Any]]:
        """Until every gateway reports (GET /api/v1/gateways) a snapshot at least `version`; the reports."""
        deadline = time.monotonic() + timeout
        reports: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline:
            reports = self.gateway_reports()
            if all(_applied(reports.get(r.gateway.replica_id, {}), version,
                            len(r.engines) if engines is None else engines)
                   for r in self.regions.values()):
                return reports
            time.sleep(0.2)
        raise TimeoutError(f"gateways never reported snapshot {version}: {reports}")

    # -- regions ---------------------------------------------------------------------------
    def start_region(self, name: str, zones: tuple[str, ...]) -> Region:
        self.declare(name, zones)
        replica = f"gw-{name}"
        config = {
            "replica_id": replica,
            "region": name,
            "registry": {"kind": "memory", "token": LEASE_TOKEN, "ttl": 2.0,
                         "state_dir": str(self.workdir / "state" / replica)},
            "recovery": {"stall_timeout": 2.0, "first_token_timeout": 30.0, "connect_timeout": 1.0},
            "routing": {"source": "snapshot", "controlplane_url": self.controlplane.url, "token": self.gateway_token,
                        "region": name, "poll_interval": 0.25, "cache_path": str(self.workdir / "state" / replica / "snapshot.json"),
                        "report_interval": 1.0, "event_flush_interval": 0.2},
        }
        gateway = GatewayProcess(config, free_port(), self.logs, replica_id=replica)
        gateway.start()
        region = self.regions[name] = Region(name, zones, gateway)
        return region

    def add_engine(self, region: Region, zone: str, instance_id: str) -> Engine:
        port = free_port()
        engine = Engine(EngineProcess(
            self.model_dir, port, instance_id, self.workdir / "state" / instance_id, self.logs / f"{instance_id}.log",
            extra_args=["--region", region.name, "--zone", zone, *region.gateway.registry_args(),
                        "--advertise-url", f"http://127.0.0.1:{port}", "--enable-fault-admin"]), region.name, zone)
        engine.start()
        region.engines.append(engine)
        return engine

    def wait_serving(self, timeout: float = 180.0) -> None:
        for region in self.regions.values():
            wait_for_http_ok(f"{region.gateway.url}/healthz/live", region.gateway.process, name=region.gateway.replica_id,
                             log_path=region.gateway.log_path, timeout=timeout)
        for region in self.regions.values():
            for engine in region.engines:
                engine.process.wait_ready(timeout=timeout)
            region.gateway.wait_routable(MODEL, len(region.engines), timeout=timeout)

    def write_drill_fleet(self, region: Region) -> None:
        """The fleet file the control plane's drill task acts on: this region's gateway and engines."""
        instances = {}
        for engine in region.engines:
            restart = ["sh", "-c", f'echo $$ > "{engine.pid_file}"; exec "$@" >> "{engine.process.log_path}" 2>&1', "restart", *engine.command()]
            instances[engine.instance_id] = {"url": engine.url, "served_model": self.model_dir.name,
                                             "pid_file": str(engine.pid_file), "restart": restart}
        self.fleet_file.write_text(yaml.safe_dump({
            "gateway_url": region.gateway.url,
            "events": {"controlplane_url": self.controlplane.url, "token": self.operator_token},
            "instances": instances,
        }))

    def close(self) -> None:
        # The control plane first: a drill it is running may restart an engine, which must not outlive us.
        self.controlplane.stop()
        for region in self.regions.values():
            for engine in region.engines:
                engine.kill(signal.SIGTERM)
        for region in self.regions.values():
            region.gateway.kill(signal.SIGTERM)



def _applied(report: dict[str, Any], version: int, engines: int) -> bool:
    """A report that says the snapshot is applied and routes to every engine the region started."""
    return (report.get("snapshot_version") or 0) >= version and len(report.get("live_endpoints", [])) >= engines
