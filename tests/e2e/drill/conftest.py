"""A local fleet for drills: a control plane (uvicorn, SQLite), one gateway, two engines with fault admin.

The gateway ships its L7 events to the control plane, so a drill reads the
`routing.tier` events it caused from GET /api/v1/events like an operator
would. `LocalFleet` is the drill's `Fleet`: kill = SIGKILL to the engine's
process; restart = a new process under the same instance id, which the
registry gives a higher generation.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from common import oneshot_http
from lifeline.processes import EngineProcess, GatewayProcess, built_model, free_port, gateway_config
from tests.support.served_controlplane import ControlPlane, served_controlplane


@dataclass
class LocalFleet:
    workdir: Path
    model: Path
    gateway: GatewayProcess
    engines: dict[str, EngineProcess] = field(default_factory=dict)
    started: list[EngineProcess] = field(default_factory=list)
    zones: dict[str, str] = field(default_factory=dict)  # instance → zone, as each engine registers it
    region: str = "local"
    redis: Any = None  # the region's lease-registry / token-log Redis, where the fleet has one (redis_down)

    @property
    def gateway_url(self) -> str:
        return self.gateway.url

    def instance_ids(self) -> list[str]:
        return sorted(self.engines)

    def engine_url(self, instance_id: str) -> str:
        return self.engines[instance_id].url

    def served_model(self, instance_id: str) -> str:
        return self.model.name

    def zone_of(self, instance_id: str) -> str | None:
        return self.zones.get(instance_id)

    def start_engine(self, instance_id: str, zone: str | None = None) -> EngineProcess:
        zone = zone or self.zones.get(instance_id, "local-a")
        self.zones[instance_id] = zone
        previous = self.gateway.leases().get(instance_id, 0)
        engine = EngineProcess(self.model, free_port(), instance_id, self.workdir / "state" / instance_id,
                               self.workdir / f"{instance_id}-{len(self.started)}.log",
                               extra_args=[*self.gateway.registry_args(), "--enable-fault-admin", "--zone", zone])
        self.started.append(engine)
        engine.start()
        engine.wait_ready()
        self.gateway.wait_generation_above(instance_id, previous)
        self.engines[instance_id] = engine
        return engine

    def kill(self, instance_id: str) -> None:
        self.engines[instance_id].kill(signal.SIGKILL)

    def restart(self, instance_id: str) -> None:
        self.engines[instance_id].kill(signal.SIGKILL)
        self.start_engine(instance_id)

    def stop(self, instance_id: str) -> None:
        self.engines[instance_id].process.send_signal(signal.SIGSTOP)

    def resume(self, instance_id: str) -> None:
        self.engines[instance_id].process.send_signal(signal.SIGCONT)

    def close(self) -> None:
        for engine in self.started:
            engine.kill()
        self.gateway.kill()


@pytest.fixture(scope="module")
def controlplane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with served_controlplane(tmp_path_factory.mktemp("drill-controlplane")) as served:
        yield served


def _gateway(controlplane: ControlPlane, workdir: Path, model: Path, replica_id: str) -> GatewayProcess:
    config = gateway_config(model, recovery={"stall_timeout": 1.0},
                            routing={"controlplane_url": controlplane.url, "token": controlplane.tokens["gateway"],
                                     "event_flush_interval": 0.1})
    gateway = GatewayProcess(config, free_port(), workdir, replica_id=replica_id)
    gateway.start()
    gateway.wait_live()
    return gateway


@pytest.fixture(scope="module")
def zone_fleet(controlplane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    """Two zones behind one gateway: a-0 and a-1 in local-a, b-0 in local-b (the zone that survives)."""
    workdir = tmp_path_factory.mktemp("drill-zone-fleet")
    model = built_model("tiny", 0)
    local = LocalFleet(workdir, model, _gateway(controlplane, workdir, model, "gw-zone"))
    try:
        for instance_id, zone in (("a-0", "local-a"), ("a-1", "local-a"), ("b-0", "local-b")):
            local.start_engine(instance_id, zone)
        local.gateway.wait_routable("tiny", 3)
        yield local
    finally:
        local.close()


@pytest.fixture(scope="module")
def fleet(controlplane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    workdir = tmp_path_factory.mktemp("drill-fleet")
    model = built_model("tiny", 0)
    config = gateway_config(model, recovery={"stall_timeout": 1.0},
                            routing={"controlplane_url": controlplane.url, "token": controlplane.tokens["gateway"],
                                     "event_flush_interval": 0.1})
    gateway = GatewayProcess(config, free_port(), workdir, replica_id="gw-drill")
    gateway.start()
    gateway.wait_live()
    local = LocalFleet(workdir, model, gateway)
    try:
        for instance_id in ("survivor", "victim"):
            local.start_engine(instance_id)
        gateway.wait_routable("tiny", 2)
        yield local
    finally:
        local.close()


def faults(url: str) -> dict[str, Any]:
    return oneshot_http.get(url + "/admin/faults", timeout=5).json()


@dataclass
class SnapshotDrillFleet:
    """The drill's `Fleet` over a `bench.snapshot_propagation.SnapshotFleet`: gateways routing by a real
    control-plane process's snapshot (its own SQLite), which the drill may silence.

    That control plane is not the one the runner records the run in (the
    `controlplane` fixture, in this process): see controlplane/drill/faults.py
    for why a controlplane_down drill takes away the API the gateways poll
    and never the runner's own database.
    """

    snap: Any
    viewer_token: str
    region: str = "local"

    @property
    def gateway_url(self) -> str:
        return self.snap.gateways[0].url

    @property
    def gateway_urls(self) -> list[str]:
        return [g.url for g in self.snap.gateways]

    @property
    def controlplane(self) -> Any:
        from controlplane.drill.faults import PidHandle

        return PidHandle(self.snap.cp_url, lambda: self.snap.controlplane.process.pid, token=self.viewer_token)

    def instance_ids(self) -> list[str]:
        return sorted(e.instance_id for e in self.snap.engines)

    def _engine(self, instance_id: str) -> EngineProcess:
        return next(e for e in self.snap.engines if e.instance_id == instance_id)

    def engine_url(self, instance_id: str) -> str:
        return self._engine(instance_id).url

    def served_model(self, instance_id: str) -> str:
        return self._engine(instance_id).model.name

    def kill(self, instance_id: str) -> None:
        raise AssertionError("a control-plane drill never kills an engine")

    restart = kill


@pytest.fixture(scope="module")
def snapshot_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SnapshotDrillFleet]:
    """One gateway routing by the snapshot of its own control-plane process, one engine (Redis lease registry)."""
    from bench.snapshot_propagation import MODEL, SnapshotFleet

    model = built_model("tiny", 0)
    snap = SnapshotFleet(tmp_path_factory.mktemp("drill-snapshot-fleet"), {model.name: model})
    try:
        snap.start_controlplane({"prod": model.name})
        viewer = snap.controlplane.create_token("viewer", "drill-viewer")
        snap.start_gateway("gw-snap")
        snap.start_engine("eng-0", model.name)
        snap.gateways[0].wait_routable(MODEL, 1)
        yield SnapshotDrillFleet(snap, viewer)
    finally:
        if snap.controlplane.process is not None and snap.controlplane.process.poll() is None:
            snap.controlplane.process.send_signal(signal.SIGCONT)  # never leave it stopped, whatever failed
        snap.close()


@pytest.fixture(scope="module")
def redis_fleet(controlplane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    """A gateway whose lease registry and token log are one private redis-server (never the shared one), two engines.

    Lease TTL 2 s (the most the gateway allows), so an outage longer than
    that is also an engine stepping down for want of a renewal (the known
    limit docs/gateway.md states; streams in flight are unaffected).
    """
    from controlplane.drill.faults import PidHandle
    from lifeline.daemons import RedisNode

    workdir = tmp_path_factory.mktemp("drill-redis-fleet")
    model = built_model("tiny", 0)
    node = RedisNode(workdir / "redis", free_port()).start()
    url = f"redis://127.0.0.1:{node.port}/0"
    config = gateway_config(model, registry={"kind": "redis", "url": url, "token": "test-lease-token", "ttl": 2.0},
                            token_log={"kind": "redis", "url": url, "owner_ttl": 2.0},
                            recovery={"stall_timeout": 10.0},
                            routing={"controlplane_url": controlplane.url, "token": controlplane.tokens["gateway"],
                                     "event_flush_interval": 0.1})
    gateway = GatewayProcess(config, free_port(), workdir, replica_id="gw-redis")
    gateway.start()
    local = LocalFleet(workdir, model, gateway,
                       redis=PidHandle(url, lambda: node.process.pid))  # type: ignore[union-attr]
    try:
        gateway.wait_live()
        for instance_id in ("r-0", "r-1"):
            local.start_engine(instance_id)
        gateway.wait_routable("tiny", 2)
        yield local
    finally:
        node.resume()  # never leave it stopped, whatever failed
        local.close()
        node.stop()
