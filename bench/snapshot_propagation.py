"""Alias move → first request answered by the new version at every gateway (routing.source=snapshot).

A real control plane (`lifeline controlplane serve`, SQLite, started by
`lifeline.processes.ControlPlaneProcess`) holds two registered versions of
the tiny model (seed 0 and seed 1: one fingerprint, different greedy
tokens, so an answer names the version that produced it). Two gateway
processes poll its snapshot (If-None-Match, `routing.poll_interval`) with a
`gateway`-role token and share one Redis lease registry with two engines.
Each move is a catalog call over the API — promote `prod` to seed 1, then
roll it back to seed 0, and so on; from the moment that call answers (the
move is committed and the snapshot version advanced), a client at each
gateway sends greedy 4-token completions back to back and the move counts
as done at a gateway when an answer carries the new version's tokens. The
move's propagation is the slowest gateway's. Printed per gateway and for
"every gateway": p50, p99 and max over the moves.

    .venv/bin/python -m bench.snapshot_propagation [--moves 20] [--poll-intervals 0.25,1.0] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import platform
import random
import signal
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.docs import replace_section
from common import oneshot_http
from lifeline.processes import (
    LEASE_TOKEN,
    ControlPlaneProcess,
    EngineProcess,
    GatewayProcess,
    built_model,
    free_port,
)

REDIS_URL = "redis://127.0.0.1:6379/0"
MODEL = "tiny"
REGION = "local"  # the gateways' and engines' default region
PROMPT = "The snapshot moved the alias, so the gateway"


@dataclass
class SnapshotFleet:
    """A real control plane, gateways routing by its snapshot, and engines; every one its own process.

    `gateway_controlplane_url` is where gateways look for the control plane:
    the control plane itself unless a test puts something in between.
    """

    workdir: Path
    versions: dict[str, Path]  # version name → model directory
    poll_interval: float = 0.25
    key_prefix: str = field(default_factory=lambda: f"lifeline-snapbench-{uuid.uuid4().hex[:8]}")
    controlplane: ControlPlaneProcess = field(init=False)
    gateway_controlplane_url: str | None = None
    gateway_token: str = ""
    operator_token: str = ""
    gateways: list[GatewayProcess] = field(default_factory=list)
    engines: list[EngineProcess] = field(default_factory=list)

    def __post_init__(self) -> None:
        # The control plane reads the regions' leases from the Redis registry the gateways write.
        self.controlplane = ControlPlaneProcess(self.workdir / "controlplane", env={
            "LIFELINE_CONTROLPLANE_LEASE_REDIS_URL": REDIS_URL,
            "LIFELINE_CONTROLPLANE_LEASE_KEY_PREFIX": self.key_prefix,
        })

    @property
    def cp_url(self) -> str:
        return self.controlplane.url

    @property
    def operator(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.operator_token}"}

    # -- the control plane ----------------------------------------------------------------
    def start_controlplane(self, aliases: dict[str, str] | None = None) -> None:
        """Start it; the first time, also create tokens, register every version, declare the region, point `aliases`."""
        first = not self.operator_token
        if first:
            self.controlplane.migrate()
            self.gateway_token = self.controlplane.create_token("gateway", "snapshot-gateways")
            self.operator_token = self.controlplane.create_token("operator", "snapshot-operator")
            for version, model_dir in sorted(self.versions.items()):
                self.controlplane.cli("catalog", "register", MODEL, version, str(model_dir))
        self.controlplane.start()
        self.controlplane.wait_ready()
        if first:
            oneshot_http.post(f"{self.cp_url}/api/v1/regions", json={"name": REGION}, headers=self.operator,
                              timeout=10).raise_for_status()
            for alias, version in (aliases or {}).items():
                self.promote(alias, version, reason="initial")

    def stop_controlplane(self) -> None:
        self.controlplane.stop(signal.SIGKILL)

    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = oneshot_http.request(method, f"{self.cp_url}/api/v1{path}", headers=self.operator, timeout=30, **kwargs)
        if response.is_error:
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text[:500]}")
        return response

    def promote(self, alias: str, version: str, reason: str = "bench") -> None:
        self.api("POST", f"/catalog/models/{MODEL}/aliases/{alias}/promote", json={"version": version, "reason": reason})

    def rollback(self, alias: str, reason: str = "bench") -> None:
        self.api("POST", f"/catalog/models/{MODEL}/aliases/{alias}/rollback", json={"reason": reason})

    def snapshot_version(self) -> int:
        """The version the control plane serves now."""
        return int(self.api("GET", "/snapshot").json()["version"])

    # -- gateways and engines ------------------------------------------------------------------
    def gateway_config(self, replica_id: str) -> dict[str, Any]:
        return {
            "registry": {"kind": "redis", "url": REDIS_URL, "key_prefix": self.key_prefix, "token": LEASE_TOKEN,
                         "ttl": 2.0, "refresh_interval": 0.1},
            "recovery": {"stall_timeout": 1.5, "first_token_timeout": 20.0, "connect_timeout": 1.0},
            "routing": {"source": "snapshot", "controlplane_url": self.gateway_controlplane_url or self.cp_url,
                        "token": self.gateway_token, "poll_interval": self.poll_interval,
                        "cache_path": str(self.workdir / replica_id / "snapshot.json"),
                        "report_interval": 1.0, "event_flush_interval": 0.2},
        }

    def start_gateway(self, replica_id: str) -> GatewayProcess:
        gateway = GatewayProcess(self.gateway_config(replica_id), free_port(), self.workdir, replica_id=replica_id)
        self.gateways.append(gateway)
        gateway.start()
        gateway.wait_live()
        return gateway

    def restart_gateway(self, gateway: GatewayProcess) -> None:
        gateway.kill()
        gateway.start()
        gateway.wait_live()

    def start_engine(self, instance_id: str, version: str, zone: str = "local-a") -> EngineProcess:
        engine = EngineProcess(self.versions[version], free_port(), instance_id, self.workdir / "state" / instance_id,
                               self.workdir / f"{instance_id}.log",
                               extra_args=[*self.gateways[0].registry_args(), "--zone", zone])
        self.engines.append(engine)
        engine.start()
        engine.wait_ready()
        return engine

    def close(self) -> None:
        for engine in self.engines:
            engine.kill()
        for gateway in self.gateways:
            gateway.kill()
        self.stop_controlplane()


def answer(gateway_url: str, model: str, client: httpx.Client | None = None) -> tuple[int, ...] | None:
    """The token ids of a short greedy completion through the gateway; None if it was refused."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    response = (client or httpx).post(f"{gateway_url}/v1/completions", json=body, timeout=30)
    if response.status_code != 200:
        return None
    return tuple(response.json()["choices"][0]["token_ids"])


def wait_answer(gateway_url: str, model: str, expected: tuple[int, ...], timeout: float = 20.0) -> float:
    """Seconds until `model` at this gateway answers with `expected`; TimeoutError naming the last answer."""
    start = time.perf_counter()
    last = None
    with httpx.Client() as client:
        while time.perf_counter() - start < timeout:
            last = answer(gateway_url, model, client)
            if last == expected:
                return time.perf_counter() - start
    raise TimeoutError(f"{gateway_url} answered {model!r} with {last}, not {expected}, for {timeout:.0f}s")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * (len(ordered) - 1)))))]


def run(moves: int, poll_interval: float) -> tuple[dict[str, list[float]], list[float]]:
    versions = {p.name: p for p in (built_model("tiny", 0), built_model("tiny", 1))}
    v0, v1 = sorted(versions)
    with tempfile.TemporaryDirectory(prefix="snapbench-") as tmp:
        fleet = SnapshotFleet(Path(tmp), versions, poll_interval=poll_interval)
        try:
            fleet.start_controlplane({"prod": v0, "canary": v1})
            gateways = [fleet.start_gateway(f"gw-{c}") for c in "ab"]
            fleet.start_engine("eng-0", v0)
            fleet.start_engine("eng-1", v1)
            for gateway in gateways:
                gateway.wait_routable(MODEL, 1)
                gateway.wait_routable(f"{MODEL}:canary", 1)
            reference = {v: answer(gateways[0].url, v) for v in (v0, v1)}
            if reference[v0] == reference[v1] or None in reference.values():
                raise RuntimeError(f"the two versions must answer differently: {reference}")
            per_gateway: dict[str, list[float]] = {g.replica_id: [] for g in gateways}
            every: list[float] = []
            with concurrent.futures.ThreadPoolExecutor(len(gateways)) as pool:
                for move in range(moves):
                    time.sleep(random.uniform(0.2, 0.6))  # spread moves over the poll phase
                    if move % 2 == 0:
                        target = v1
                        fleet.promote("prod", v1)
                    else:
                        target = v0
                        fleet.rollback("prod")  # back to v0: the version before the latest promote
                    futures = {g.replica_id: pool.submit(wait_answer, g.url, MODEL, reference[target]) for g in gateways}
                    took = {rid: f.result() for rid, f in futures.items()}
                    for rid, seconds in took.items():
                        per_gateway[rid].append(seconds)
                    every.append(max(took.values()))
        finally:
            fleet.close()
    return per_gateway, every


def report(moves: int, results: dict[float, tuple[dict[str, list[float]], list[float]]]) -> str:
    def row(interval: float, name: str, values: list[float]) -> str:
        return (f"| {interval * 1000:.0f} | {name} | {len(values)} | {statistics.median(values) * 1000:.0f} "
                f"| {_pct(values, 0.99) * 1000:.0f} | {max(values) * 1000:.0f} |")

    lines = [
        (f"{moves} alias moves per row (catalog API: promote, then rollback, alternating), 2 gateway processes, "
        f"2 engines, a real control plane (`lifeline controlplane serve`, SQLite), "
        f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, on a shared 2-core "
        "machine. Time from the promote/rollback call's answer (the move committed, the snapshot version "
        "advanced) to the first answer from the new version (greedy 4-token completions sent back to back at "
        "each gateway, so it includes that request's own latency). \"every gateway\" is the slowest gateway of "
        "each move — what a cutover waits for."),
        "",
        "| poll_interval ms | gateway | moves | p50 ms | p99 ms | max ms |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for interval, (per_gateway, every) in results.items():
        lines += [row(interval, rid, values) for rid, values in per_gateway.items()]
        lines.append(row(interval, "**every gateway**", every))
    default = results.get(0.25)
    if default is not None:
        met = _pct(default[1], 0.99) <= 1.0
        lines += ["", (f"Target (issue 8): p99 ≤ 1000 ms at every gateway with the default poll_interval (250 ms): "
                      f"{'met' if met else 'NOT met'}. A poll that finds nothing new is a 304 that reads one row; "
                      "a move costs the wait for the next poll (up to one poll_interval), the control plane building "
                      "the snapshot once per gateway, one apply (validate, verify the checksums of a version not seen "
                      "before, write the disk copy, swap) and one request.")]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--moves", type=int, default=20)
    parser.add_argument("--poll-intervals", default="0.25,1.0", help="seconds, comma-separated; one run each")
    parser.add_argument("--write", type=Path, help="replace this section of docs/benchmarks.md")
    args = parser.parse_args()
    intervals = [float(x) for x in args.poll_intervals.split(",")]
    table = report(args.moves, {interval: run(args.moves, interval) for interval in intervals})
    print(table)
    if args.write:
        replace_section(args.write, "## Snapshot propagation (bench/snapshot_propagation.py)", table)


if __name__ == "__main__":
    main()
