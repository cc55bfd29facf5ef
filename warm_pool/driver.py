"""Pool drivers: what starts and stops instances. One interface; `local` runs engine processes here.

    start(instance_id, zone, version) → PoolInstance   begin loading (the instance is COLD until it answers)
    refresh()                                          re-read what exists (the agent calls it once a tick)
    adopt() → [PoolInstance]                           instances a previous agent left running, taken back
    alive(instance_id) → bool                          the process / pod still exists, as last read
    stop(instance_id, graceful)                        SIGTERM and wait (drain), or SIGKILL

`pool.driver` picks one (`build_driver`): `local` here, or `kubernetes`
(warm_pool/kubernetes_driver.py), which implements the same calls by
scaling one Deployment per region × zone × version and listing its pods;
the agent does not know which driver it has. Instances the pool starts never register
their own leases: the agent holds them, so promotion from warm to serving is
a lease (a routing change), not a load.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from common.logs import get_logger
from common.ports import free_port
from warm_pool.settings import PoolSettings

log = get_logger(__name__)


class PoolDriverError(Exception):
    """The driver cannot do what was asked: a setting that cannot work, or a cluster that did not do it in time."""


@dataclass
class PoolInstance:
    instance_id: str
    zone: str
    version: str
    url: str


class PoolDriver(Protocol):
    async def start(self, *, instance_id: str, zone: str, version: str) -> PoolInstance: ...

    async def refresh(self) -> None: ...

    async def adopt(self) -> list[PoolInstance]: ...

    def alive(self, instance_id: str) -> bool: ...

    async def stop(self, instance_id: str, *, graceful: bool) -> None: ...

    async def close(self) -> None: ...


@dataclass
class _Process:
    instance: PoolInstance
    popen: subprocess.Popen
    log_file: IO[bytes] = field(repr=False)


class LocalDriver:
    """`lifeline engine serve` processes on this machine, one port each (embedded default, demo, tests)."""

    def __init__(self, *, region: str, versions: dict[str, Path], state_dir: Path,
                 engine_args: list[str] | None = None, stop_timeout: float = 10.0) -> None:
        self.region = region
        self.versions = versions
        self.state_dir = state_dir
        self.engine_args = engine_args or []
        self.stop_timeout = stop_timeout
        self.processes: dict[str, _Process] = {}

    async def start(self, *, instance_id: str, zone: str, version: str) -> PoolInstance:
        port = free_port()
        directory = self.state_dir / instance_id
        directory.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "lifeline.cli", "engine", "serve", "--model", str(self.versions[version]),
               "--served-model-name", version, "--port", str(port), "--instance-id", instance_id,
               "--zone", zone, "--region", self.region, "--state-dir", str(directory),
               "--torch-threads", "1", *self.engine_args]
        log_file = open(directory / "engine.log", "ab")  # noqa: SIM115 - closed in stop()
        popen = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
        instance = PoolInstance(instance_id, zone, version, f"http://127.0.0.1:{port}")
        self.processes[instance_id] = _Process(instance, popen, log_file)
        log.info("pool instance started", instance=instance_id, zone=zone, version=version, pid=popen.pid, port=port)
        return instance

    async def refresh(self) -> None:
        """Nothing to re-read: `alive` asks the operating system each time."""

    async def adopt(self) -> list[PoolInstance]:
        """None: a previous agent's engine processes are not its children, so they cannot be stopped or watched
        from here (docs/warm_pool.md, limits)."""
        return []

    def alive(self, instance_id: str) -> bool:
        process = self.processes.get(instance_id)
        return process is not None and process.popen.poll() is None

    def pid(self, instance_id: str) -> int | None:
        process = self.processes.get(instance_id)
        return process.popen.pid if process else None

    async def stop(self, instance_id: str, *, graceful: bool) -> None:
        process = self.processes.pop(instance_id, None)
        if process is None:
            return
        if process.popen.poll() is None:
            process.popen.send_signal(signal.SIGTERM if graceful else signal.SIGKILL)
            for _ in range(int(self.stop_timeout / 0.05)):
                if process.popen.poll() is not None:
                    break
                await asyncio.sleep(0.05)
            else:
                process.popen.kill()
                await asyncio.to_thread(process.popen.wait, 5)
        process.log_file.close()

    async def close(self) -> None:
        for instance_id in list(self.processes):
            await self.stop(instance_id, graceful=False)


def build_driver(region: str, pool: PoolSettings) -> PoolDriver:
    """The driver `pool.driver` names, from its own settings; PoolDriverError names a setting that cannot work."""
    if pool.driver == "kubernetes":
        from warm_pool.kubernetes_driver import KubernetesDriver, api_client_for

        assert pool.kubernetes is not None  # PoolSettings requires it with this driver
        return KubernetesDriver(region=region, config=pool.kubernetes, api_client=api_client_for(pool.kubernetes),
                                model_dirs={version: str(path) for version, path in pool.versions.items()})
    assert pool.state_dir is not None  # PoolSettings requires it with this driver
    return LocalDriver(region=region, versions=pool.versions, state_dir=pool.state_dir, engine_args=pool.engine_args)
