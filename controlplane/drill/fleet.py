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
        pid_file: /run/lifeline/eng-0.pid        # SIGKILL goes to this pid
        restart: [lifeline, engine, serve, ...]   # how the pool brings it back (detached)

In production the pool driver does kill and restart; this is the local
stand-in, named as such. A restart waits for /healthz/ready (bounded).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from pydantic import BaseModel, ConfigDict, Field

from controlplane.drill.faults import PidHandle


class FleetInstance(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str
    served_model: str
    zone: str | None = None
    pid_file: Path | None = None
    restart: list[str] = Field(default_factory=list)


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


class FileFleet:
    def __init__(self, spec: FleetFile, *, sleep: Any = time.sleep) -> None:
        self.spec = spec
        self.gateway_url = spec.gateway_url
        self.gateway_urls = spec.gateway_urls or [spec.gateway_url]
        self.region = spec.region
        self.sleep = sleep
        self.controlplane = self._handle(spec.controlplane)
        self.redis = self._handle(spec.redis)

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

    def kill(self, instance_id: str) -> None:
        pid_file = self.spec.instances[instance_id].pid_file
        if pid_file is None:
            raise RuntimeError(f"fleet: instance {instance_id} has no pid_file; it cannot be killed")
        try:
            os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
        except ProcessLookupError:
            pass  # already gone

    def restart(self, instance_id: str) -> None:
        instance = self.spec.instances[instance_id]
        if not instance.restart:
            raise RuntimeError(f"fleet: instance {instance_id} has no restart command")
        subprocess.Popen(instance.restart, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
        deadline = time.monotonic() + self.spec.ready_timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.engine_url(instance_id) + "/healthz/ready", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            self.sleep(0.2)
        raise TimeoutError(f"fleet: {instance_id} not ready within {self.spec.ready_timeout_s:.0f}s of its restart")
