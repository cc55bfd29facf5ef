"""A fleet described in a file, for drills run by Celery or `lifeline drill run --fleet`.

    gateway_url: http://127.0.0.1:8080
    gateway_urls: [http://127.0.0.1:8080, http://127.0.0.1:8081]   # optional: every replica of the region
    region: local                                 # optional: the region it serves (checked against the radius)
    events: {controlplane_url: http://127.0.0.1:8400, token: ll_...}   # optional: routing.tier events
    controlplane: {url: http://127.0.0.1:8400, token: ll_..., pid_file: /run/lifeline/cp.pid}
                                                  # optional: the API the gateways poll (controlplane_down)
    redis: {url: redis://127.0.0.1:6390/0, pid_file: /run/lifeline/redis.pid}   # optional (redis_down)
    instances:
      eng-0:
        url: http://127.0.0.1:8001
        served_model: tiny-seed0
        zone: local-a                            # optional: zone drills need every instance's zone
        pid_file: /run/lifeline/eng-0.pid        # SIGKILL goes to this pid (vllm: its process group);
                                                 # SIGSTOP / SIGCONT too (vllm: its engine core only)
        engine: reference                        # optional: reference (default) | vllm (stock vLLM: no fault
                                                 # admin; killed with its engine core; ready on /health)
        restart: [lifeline, engine, serve, ...]   # how the pool brings it back (detached)
        bad_version: [vllm, serve, /models/tiny-v0, --served-model-name, tiny-seed0, ...]
                                                 # optional (bad_version drills): the same instance started from
                                                 # another version's weights under the same name and pid_file
        region: us                               # optional: another region's instance (default `region`)

A region drill (`region_loss`) also needs every region's gateways, the DNS
tier that moves the record, and the cutover API the drill rolls back:

    regions:                                   # every region, the drilled one (`region`) included
      eu: {gateways: {gw-eu: {url: http://127.0.0.1:8080, pid_file: /run/lifeline/gw-eu.pid,
                              restart: [lifeline, gateway, serve, ...]}}}
      us: {gateways: {gw-us: {url: http://127.0.0.1:8081, pid_file: /run/lifeline/gw-us.pid}}}
    dns: {server: 127.0.0.1, port: 5353, name: api.lifeline.test.,
          answers: {eu: [192.0.2.10], us: [198.51.100.10]}}   # the record's addresses while each region serves
    cutovers: {controlplane_url: http://127.0.0.1:8400, token: ll_...}   # an operator's: rollback

In production the pool driver does kill and restart; this is the local
stand-in, named as such. A restart waits for /healthz/ready (bounded).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Literal

import httpx
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from common import oneshot_http
from common.vllm_processes import engine_processes
from controlplane.drill.faults import PidHandle
from controlplane.drill.tiers import DnsObserver, HttpCutovers


class FleetInstance(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str
    served_model: str
    zone: str | None = None
    pid_file: Path | None = None
    restart: list[str] = Field(default_factory=list)
    bad_version: list[str] = Field(default_factory=list)
    region: str | None = None  # unset: the fleet's region
    engine: Literal["reference", "vllm"] = "reference"


class FleetGateway(BaseModel):
    """One gateway replica of a region: where clients reach it, its pid (SIGKILL) and how it comes back."""

    model_config = ConfigDict(extra="forbid")

    url: str
    pid_file: Path | None = None
    restart: list[str] = Field(default_factory=list)


class FleetRegion(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gateways: dict[str, FleetGateway] = Field(min_length=1)


class FleetDns(BaseModel):
    """The authoritative server of the name clients resolve, and the record's addresses per serving region."""

    model_config = ConfigDict(extra="forbid")

    server: str
    port: int = Field(53, ge=1, le=65535)
    name: str
    answers: dict[str, list[str]] = Field(min_length=2)
    timeout_s: float = Field(1.0, gt=0, le=30)


class FleetEvents(BaseModel):
    model_config = ConfigDict(extra="forbid")

    controlplane_url: str
    token: str


class FleetProcess(BaseModel):
    """A process an outage drill may silence (SIGSTOP / SIGCONT by its pid file)."""

    model_config = ConfigDict(extra="forbid")

    url: str
    token: str | None = None
    pid_file: Path


class FleetFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gateway_url: str
    gateway_urls: list[str] = Field(default_factory=list)
    region: str | None = None  # unset: the region each drill's blast radius names
    events: FleetEvents | None = None
    controlplane: FleetProcess | None = None
    redis: FleetProcess | None = None
    instances: dict[str, FleetInstance]
    ready_timeout_s: float = Field(120.0, gt=0)
    regions: dict[str, FleetRegion] = Field(default_factory=dict)
    dns: FleetDns | None = None
    cutovers: FleetEvents | None = None

    @model_validator(mode="after")
    def _regions_wired(self) -> FleetFile:
        """A region tier half described fails here, naming the key, not mid-drill."""
        if not (self.regions or self.dns or self.cutovers):
            return self
        if self.region is None or self.region not in self.regions:
            raise ValueError(f"region: {self.region!r} must be one of regions {sorted(self.regions)}")
        if self.dns is None or self.cutovers is None:
            raise ValueError("dns and cutovers: a fleet with regions wires the dns tier and the cutover API")
        if missing := sorted(set(self.regions) - set(self.dns.answers)):
            raise ValueError(f"dns.answers: no address for region(s) {missing}")
        if unknown := sorted({i.region for i in self.instances.values() if i.region} - set(self.regions)):
            raise ValueError(f"instances.*.region: {unknown} not in regions")
        return self


class _DnsTier:
    def __init__(self, dns: FleetDns) -> None:
        self.dns = dns

    def observer(self, region: str) -> DnsObserver:
        return DnsObserver(self.dns.server, self.dns.port, self.dns.name, list(self.dns.answers[region]),
                           timeout_s=self.dns.timeout_s)


class FileFleet:
    def __init__(self, spec: FleetFile, *, sleep: Any = time.sleep) -> None:
        self.spec = spec
        self.gateway_url = spec.gateway_url
        self.gateway_urls = spec.gateway_urls or [spec.gateway_url]
        self.region = spec.region
        self.sleep = sleep
        self.controlplane = self._handle(spec.controlplane)
        self.redis = self._handle(spec.redis)
        # The region tier (region drills): None unless the file describes it (then the drill is refused
        # `region_tier_not_wired`, as before).
        self.dns_tier = _DnsTier(spec.dns) if spec.dns is not None and len(spec.regions) >= 2 else None
        self.cutovers = (HttpCutovers(spec.cutovers.controlplane_url, spec.cutovers.token)
                         if spec.cutovers is not None else None)

    @staticmethod
    def _handle(process: FleetProcess | None) -> PidHandle | None:
        if process is None:
            return None
        pid_file = process.pid_file
        return PidHandle(process.url, lambda: int(pid_file.read_text().strip()), token=process.token)

    @classmethod
    def load(cls, path: Path) -> FileFleet:
        return cls(FleetFile.model_validate(yaml.safe_load(Path(path).read_text())))

    def instance_ids(self) -> list[str]:
        return sorted(self.spec.instances)

    def engine_url(self, instance_id: str) -> str:
        return self.spec.instances[instance_id].url.rstrip("/")

    def served_model(self, instance_id: str) -> str:
        return self.spec.instances[instance_id].served_model

    def zone_of(self, instance_id: str) -> str | None:
        return self.spec.instances[instance_id].zone

    def engine_of(self, instance_id: str) -> str:
        """`reference` or `vllm`: which fault hooks the instance has (faults.plan_fault refuses the others)."""
        return self.spec.instances[instance_id].engine

    def regions(self) -> list[str]:
        return sorted(self.spec.regions) if self.spec.regions else [r for r in [self.region] if r]

    def region_of(self, instance_id: str) -> str | None:
        return self.spec.instances[instance_id].region or self.region

    def resolve_gateway(self) -> str:
        """What a client does: ask the name's authoritative server, go to the region it answers (a gateway
        of it). Without a dns tier, the fleet's gateway."""
        if self.dns_tier is None:
            return self.gateway_url
        answer = set(self.dns_tier.observer(self.regions()[0]).answer())
        for region in self.regions():
            if answer & set(self.spec.dns.answers[region]):  # type: ignore[union-attr]
                return next(iter(self.spec.regions[region].gateways.values())).url.rstrip("/")
        raise RuntimeError(f"fleet: the dns server answers {sorted(answer)}, no region's address")

    def all_processes(self) -> dict[str, tuple[str, int | None]]:
        """Every process the fleet places in a region, with its pid (None: not running or unknown)."""
        out: dict[str, tuple[str, int | None]] = {
            i: (self.region_of(i) or "", _read_pid(spec.pid_file)) for i, spec in self.spec.instances.items()}
        for region, spec in self.spec.regions.items():
            out |= {f"gateway:{name}": (region, _read_pid(g.pid_file)) for name, g in spec.gateways.items()}
        return out

    def kill_process(self, name: str) -> None:
        if name in self.spec.instances:
            self.kill(name)
            return
        gateway = self._gateway(name)
        if gateway.pid_file is None:
            raise RuntimeError(f"fleet: {name} has no pid_file; it cannot be killed")
        _kill(gateway.pid_file)

    def restore_region(self, region: str) -> None:
        """The region's gateways restarted (and live), then its engines (ready)."""
        for name, gateway in self.spec.regions[region].gateways.items():
            if not gateway.restart:
                raise RuntimeError(f"fleet: gateway:{name} has no restart command")
            subprocess.Popen(gateway.restart, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
            self._wait(gateway.url.rstrip("/") + "/healthz/live", f"gateway:{name}")
        for instance_id in self.instance_ids():
            if self.region_of(instance_id) == region:
                self.restart(instance_id)

    def _gateway(self, name: str) -> FleetGateway:
        for spec in self.spec.regions.values():
            if (gateway := spec.gateways.get(name.removeprefix("gateway:"))) is not None:
                return gateway
        raise KeyError(f"fleet: no process {name}")

    def _wait(self, url: str, what: str) -> None:
        deadline = time.monotonic() + self.spec.ready_timeout_s
        while time.monotonic() < deadline:
            try:
                if oneshot_http.get(url, timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            self.sleep(0.2)
        raise TimeoutError(f"fleet: {what} not ready within {self.spec.ready_timeout_s:.0f}s of its restart")

    def kill(self, instance_id: str) -> None:
        instance = self.spec.instances[instance_id]
        if instance.pid_file is None:
            raise RuntimeError(f"fleet: instance {instance_id} has no pid_file; it cannot be killed")
        # vLLM's engine core is a child of its API server: a node loss takes both, and a SIGKILL of the
        # server alone would leave the core holding the accelerator
        _kill(instance.pid_file, group=instance.engine == "vllm")

    def stop(self, instance_id: str) -> None:
        """SIGSTOP the instance's engine: the reference engine's process; stock vLLM's engine core(s) alone, so
        its API server still answers `/health` (the wedge vLLM's own health check does not see)."""
        for pid in self._engine_pids(instance_id):
            os.kill(pid, signal.SIGSTOP)

    def resume(self, instance_id: str) -> None:
        """SIGCONT what `stop` stopped (harmless on a process that runs)."""
        for pid in self._engine_pids(instance_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def _engine_pids(self, instance_id: str) -> list[int]:
        instance = self.spec.instances[instance_id]
        pid = _read_pid(instance.pid_file)
        if pid is None:
            raise RuntimeError(f"fleet: instance {instance_id} has no running process in its pid_file "
                               f"({instance.pid_file}); it cannot be stopped")
        if instance.engine != "vllm":
            return [pid]
        cores = [process.pid for process in engine_processes(pid)]
        if not cores:
            raise RuntimeError(f"fleet: vLLM instance {instance_id} (pid {pid}) has no engine core process under "
                               "its API server to stop")
        return cores

    def restart(self, instance_id: str) -> None:
        instance = self.spec.instances[instance_id]
        if not instance.restart:
            raise RuntimeError(f"fleet: instance {instance_id} has no restart command")
        self._start(instance_id, instance.restart)

    def can_deploy_bad_version(self, instance_id: str) -> bool:
        return bool(self.spec.instances[instance_id].bad_version)

    def deploy_bad_version(self, instance_id: str) -> None:
        """The instance replaced by its `bad_version` command: another version's weights under the same name
        and address, as a rollout that shipped the wrong build leaves it. Returns once it answers."""
        instance = self.spec.instances[instance_id]
        if not instance.bad_version:
            raise RuntimeError(f"fleet: instance {instance_id} has no bad_version command")
        self._replace(instance_id, instance.bad_version)

    def redeploy(self, instance_id: str) -> None:
        """Whatever runs at the instance's address replaced by its own version (`restart`)."""
        if not self.spec.instances[instance_id].restart:
            raise RuntimeError(f"fleet: instance {instance_id} has no restart command")
        self._replace(instance_id, self.spec.instances[instance_id].restart)

    def _replace(self, instance_id: str, command: list[str]) -> None:
        if _read_pid(self.spec.instances[instance_id].pid_file) is not None:
            self.kill(instance_id)
        self._wait_gone(instance_id)  # its port free again, or the new process could not listen
        self._start(instance_id, command)

    def _start(self, instance_id: str, command: list[str]) -> None:
        subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        ready = "/health" if self.engine_of(instance_id) == "vllm" else "/healthz/ready"  # vLLM has only /health
        self._wait(self.engine_url(instance_id) + ready, instance_id)

    def _wait_gone(self, instance_id: str) -> None:
        """Until nothing answers at the instance's address (a killed process's listening socket closes with it;
        its pid may linger as a zombie of whoever started it, so the pid says nothing)."""
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            try:
                oneshot_http.get(self.engine_url(instance_id) + "/health", timeout=1.0)
            except httpx.ConnectError:
                return
            except httpx.TransportError:
                pass
            self.sleep(0.1)
        raise TimeoutError(f"fleet: something still answers at {instance_id}'s address 30 s after its kill")


def _read_pid(pid_file: Path | None) -> int | None:
    """The pid a pid file names, if that process is running."""
    if pid_file is None:
        return None
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def _kill(pid_file: Path, *, group: bool = False) -> None:
    """SIGKILL the pid file's process; with `group`, its whole process group (it leads one: vLLM started in a
    session of its own), else the process alone."""
    pid = int(pid_file.read_text().strip())
    try:
        if group and os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # already gone
