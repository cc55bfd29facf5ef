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

Standbys (LocalDriver, `standby=True`, off by default). An engine attached to
a memory holder (`--holder` in `engine_args`) re-maps its weights in ~0.1 s,
but a new interpreter spends ~2.8 s importing torch and the engine first
(docs/benchmarks.md). With standbys on, the driver keeps one warm standby
process (contract/standby.py, `python -m engine.standby`) per holder-backed
instance it runs, and `start` hands the next one the `engine serve`
arguments instead of spawning an interpreter: the instance the agent asked
for is up in the holder's attach + self-test time. `refresh` (each agent
tick) retires standbys the pool no longer needs and spawns missing ones one
at a time — a warm-up is a whole interpreter start, so never two at once and
never in `start` itself, where it would compete with the engine it starts.
Each standby is *primed* (contract.standby.StandbyPrime): the driver knows the
holder URL, the model directory of the version its holder-backed instances
run and the dtype, so the standby maps, pre-faults and self-tests the
holder's weights while it waits, and the instance it becomes skips both on
its start. `start` prefers a standby primed for the version it starts; one
primed for another (or not at all) still serves, re-mapping as before.

Why off by default: each standby is an idle interpreter with torch imported
(~180 MiB anonymous memory, no CPU while it waits), one per holder-backed
instance; an engine without a holder gains 2.8 s of a 4+ s cold load and
gets none. A standby that died, or none warm yet, means a new interpreter:
never slower than without standbys (a standby still importing is used, and
reads its arguments when its imports finish).

Other engines (LocalDriver, `pool.commands`): a version with a command
template (stock vLLM: `lifeline.vllm.pool_command()`, the same command line
the tests and benches run) starts from it instead of `lifeline engine serve`,
in its own session, and holds no lease: the agent holds it. A graceful stop
is then: the agent has released the lease already; the driver waits the
command's `unroute_wait` (gateways re-read the registry), SIGTERMs the
process (vLLM stops taking requests and drains for its `--shutdown-timeout`)
and SIGKILLs the whole process group after `stop_timeout` (vLLM's engine
core is a child process: a SIGKILL of the API server alone would orphan it).

Holder tenancies (LocalDriver, any `--holder` in `engine_args`): `stop` of an
instance that did not exit cleanly releases its tenancy at the holder, since
the agent replaces it under a new instance id and no successor would ever
unfreeze its blocks (`_release_tenancy`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

import httpx

from common.logs import get_logger
from common import oneshot_http
from common.ports import free_port
from contract.standby import StandbyEngine, StandbyPrime
from warm_pool.settings import EngineCommand, PoolSettings

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
    log_file: IO[bytes] | None = field(repr=False)  # None: an activated standby, which holds its own
    holder_backed: bool = False
    from_standby: bool = False
    command: EngineCommand | None = None  # started from pool.commands (stock vLLM), not `lifeline engine serve`


def _flag_value(engine_args: list[str], flag: str) -> str | None:
    """The value of `flag` in `engine serve` arguments (`--flag VALUE` / `--flag=VALUE`), the last one given."""
    value = None
    for index, arg in enumerate(engine_args):
        if arg.startswith(f"{flag}="):
            value = arg.removeprefix(f"{flag}=")
        elif arg == flag and index + 1 < len(engine_args):
            value = engine_args[index + 1]
    return value


def holder_url(engine_args: list[str]) -> str | None:
    """The memory holder `engine serve` with these flags attaches to (`--holder URL` / `--holder=URL`), if any."""
    return _flag_value(engine_args, "--holder")


def uses_holder(engine_args: list[str]) -> bool:
    return holder_url(engine_args) is not None


# An engine's SIGTERM drain (engine/drain.py) with its default settings: the unroute wait (1 s), in-flight
# requests finishing (`drain_timeout`, 30 s), then the stragglers' `engine_draining` flushed (5 s); and a margin.
ENGINE_DRAIN_S = 1.0 + 30.0 + 5.0 + 4.0


class LocalDriver:
    """`lifeline engine serve` processes on this machine, one port each (embedded default, demo, tests).

    `stop_timeout` is how long a stop waits for the process before SIGKILL. It covers a whole
    drain, so a stream still running at a retire ends with `engine_draining`, not a reset; a
    graceful stop runs in the background of the pool's tick, so the wait holds nothing else up.
    """

    def __init__(self, *, region: str, versions: dict[str, Path], state_dir: Path,
                 engine_args: list[str] | None = None, stop_timeout: float = ENGINE_DRAIN_S,
                 standby: bool = False, commands: dict[str, EngineCommand] | None = None) -> None:
        self.region = region
        self.versions = versions
        self.state_dir = state_dir
        self.engine_args = engine_args or []
        self.stop_timeout = stop_timeout
        self.standby = standby
        self.commands = commands or {}
        self.processes: dict[str, _Process] = {}
        self.standbys: list[StandbyEngine] = []  # spawned, not yet activated; the oldest first
        self._standby_seq = 0

    async def start(self, *, instance_id: str, zone: str, version: str) -> PoolInstance:
        port = free_port()
        directory = self.state_dir / instance_id
        directory.mkdir(parents=True, exist_ok=True)
        if (command := self.commands.get(version)) is not None:
            return self._start_command(command, instance_id=instance_id, zone=zone, version=version, port=port,
                                       directory=directory)
        serve_args = ["--model", str(self.versions[version]), "--served-model-name", version, "--port", str(port),
                      "--instance-id", instance_id, "--zone", zone, "--region", self.region,
                      "--state-dir", str(directory), "--torch-threads", "1", *self.engine_args]
        holder_backed = uses_holder(self.engine_args)
        popen = (self._activate_standby(serve_args, directory, self.versions[version])
                 if self.standby and holder_backed else None)
        log_file = None
        if popen is None:
            cmd = [sys.executable, "-m", "lifeline.cli", "engine", "serve", *serve_args]
            log_file = open(directory / "engine.log", "ab")  # noqa: SIM115 - closed in stop()
            popen = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
        instance = PoolInstance(instance_id, zone, version, f"http://127.0.0.1:{port}")
        self.processes[instance_id] = _Process(instance, popen, log_file, holder_backed, log_file is None)
        log.info("pool instance started", instance=instance_id, zone=zone, version=version, pid=popen.pid, port=port,
                 from_standby=log_file is None)
        return instance

    def _start_command(self, command: EngineCommand, *, instance_id: str, zone: str, version: str, port: int,
                       directory: Path) -> PoolInstance:
        """An engine started from its version's command template (stock vLLM), in a session of its own."""
        argv = command.render(model_dir=str(self.versions[version]), version=version, port=str(port),
                              instance_id=instance_id, zone=zone, region=self.region, state_dir=str(directory))
        log_file = open(directory / "engine.log", "ab")  # noqa: SIM115 - closed in stop()
        popen = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
                                 env={**os.environ, **command.env})
        instance = PoolInstance(instance_id, zone, version, f"http://127.0.0.1:{port}")
        self.processes[instance_id] = _Process(instance, popen, log_file, command=command)
        log.info("pool instance started", instance=instance_id, zone=zone, version=version, pid=popen.pid, port=port,
                 command=argv[:4])
        return instance

    def _activate_standby(self, serve_args: list[str], directory: Path, model_dir: Path) -> subprocess.Popen | None:
        """The process of the first standby that takes `serve_args` (primed for `model_dir` first, then warm
        ones), or None: start cold."""
        def preference(standby: StandbyEngine) -> tuple[bool, bool]:
            primed_here = standby.primed and standby.prime is not None and standby.prime.model_dir == model_dir
            return not primed_here, not standby.warm

        for standby in sorted(self.standbys, key=preference):
            self.standbys.remove(standby)
            log_path, warm, primed = standby.log_path, standby.warm, standby.primed
            popen = standby.activate(serve_args)
            if popen is None:
                log.warning("pool standby was dead; trying the next", log=str(log_path))
                continue
            engine_log = directory / "engine.log"
            if not engine_log.exists():  # same filesystem: the standby keeps writing through its descriptor
                log_path.replace(engine_log)
            log.info("pool standby activated", pid=popen.pid, warm=warm, primed=primed)
            return popen
        return None

    def standbys_wanted(self) -> int:
        """One per holder-backed instance this driver runs (its replacement, should it die), with standbys on."""
        if not self.standby:
            return 0
        return sum(1 for p in self.processes.values() if p.holder_backed)

    async def refresh(self) -> None:
        """Keep the standbys: drop dead ones, retire the surplus, spawn one missing when the others are warm.

        Nothing else to re-read: `alive` asks the operating system each time.
        """
        self.standbys = [s for s in self.standbys if s.alive]
        wanted = self.standbys_wanted()
        while len(self.standbys) > wanted:
            surplus = min(self.standbys, key=lambda s: s.warm)  # the least advanced goes first
            self.standbys.remove(surplus)
            await asyncio.to_thread(surplus.close)
        if len(self.standbys) < wanted and all(s.warm for s in self.standbys):
            self._spawn_standby()

    def _prime_for(self) -> StandbyPrime | None:
        """What the next standby primes: the holder, and the version whose holder-backed instances have the
        fewest standbys primed for them (the pool's most likely replacement)."""
        url = holder_url(self.engine_args)
        running = Counter(p.instance.version for p in self.processes.values() if p.holder_backed)
        if url is None or not running:
            return None
        primed = Counter(s.prime.model_dir for s in self.standbys if s.prime is not None)
        version = max(running, key=lambda v: running[v] - primed[self.versions[v]])
        return StandbyPrime(url, self.versions[version], _flag_value(self.engine_args, "--dtype") or "float64")

    def _spawn_standby(self) -> StandbyEngine:
        self._standby_seq += 1
        directory = self.state_dir / "standbys"
        standby = StandbyEngine(directory / f"standby-{self._standby_seq}.log",
                                directory / f"standby-{self._standby_seq}.ready", torch_threads=1,
                                prime=self._prime_for(), popen_kwargs={"start_new_session": True})
        standby.spawn()
        self.standbys.append(standby)
        assert standby.process is not None  # noqa: S101 - spawn() sets it
        log.info("pool standby spawned", pid=standby.process.pid, wanted=self.standbys_wanted(),
                 primed_for=str(standby.prime.model_dir) if standby.prime else None)
        return standby

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
        command = process.command
        stop_timeout = command.stop_timeout.total_seconds() if command is not None else self.stop_timeout
        if process.popen.poll() is None:
            if graceful and command is not None and command.unroute_wait.total_seconds() > 0:
                # The agent released the lease just before; give the gateways' lease views time to drop it,
                # so no new request reaches an engine that is about to refuse them.
                await asyncio.sleep(command.unroute_wait.total_seconds())
            if graceful:
                process.popen.send_signal(signal.SIGTERM)
            else:
                _kill_group(process.popen)
            for _ in range(int(stop_timeout / 0.05)):
                if process.popen.poll() is not None:
                    break
                await asyncio.sleep(0.05)
            else:
                _kill_group(process.popen)
                await asyncio.to_thread(process.popen.wait, 5)
        if command is not None:
            _kill_group(process.popen)  # what the engine left behind in its session (vLLM's engine core)
        if process.log_file is not None:
            process.log_file.close()
        if process.holder_backed and process.popen.returncode != 0:
            await asyncio.to_thread(self._release_tenancy, instance_id)

    def _release_tenancy(self, instance_id: str) -> None:
        """End a dead instance's tenancy at the holder: no successor will ever take it over.

        The holder freezes a tenant that stops renewing and keeps its blocks for a successor under the
        same instance id — but the agent replaces a lost instance under a new id, so nothing would ever
        unfreeze it, and its KV blocks would pin the pool (frozen tenants' blocks are never evicted).
        Released, its uncommitted blocks are freed and its committed ones stay findable by hash
        (lookup) and evictable. A clean exit released itself; a holder that does not answer leaves
        the tenant frozen, which is the safe side.
        """
        url = holder_url(self.engine_args)
        try:
            generation = int((self.state_dir / instance_id / "generation").read_text())
        except (OSError, ValueError):
            return  # it never took a boot generation, so it never attached
        try:
            response = oneshot_http.post(f"{url}/v1/tenants/{instance_id}/release", json={"generation": generation},
                                         timeout=httpx.Timeout(2.0, connect=0.5))
        except httpx.HTTPError as exc:
            log.warning("holder tenancy not released; it stays frozen", instance=instance_id, error=repr(exc))
            return
        log.info("holder tenancy released", instance=instance_id, generation=generation,
                 status=response.status_code)  # 404: it never attached (loaded from disk); 409: superseded

    async def close(self) -> None:
        standbys, self.standbys = self.standbys, []
        for standby in standbys:
            await asyncio.to_thread(standby.close)
        for instance_id in list(self.processes):
            await self.stop(instance_id, graceful=False)


def _kill_group(popen: subprocess.Popen) -> None:
    """SIGKILL the process's whole session (it was started with one of its own), then the process itself."""
    try:
        os.killpg(popen.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if popen.poll() is None:
        popen.kill()


def build_driver(region: str, pool: PoolSettings) -> PoolDriver:
    """The driver `pool.driver` names, from its own settings; PoolDriverError names a setting that cannot work."""
    if pool.driver == "kubernetes":
        from warm_pool.kubernetes_driver import KubernetesDriver, api_client_for

        assert pool.kubernetes is not None  # PoolSettings requires it with this driver
        return KubernetesDriver(region=region, config=pool.kubernetes, api_client=api_client_for(pool.kubernetes),
                                model_dirs={version: str(path) for version, path in pool.versions.items()})
    assert pool.state_dir is not None  # PoolSettings requires it with this driver
    return LocalDriver(region=region, versions=pool.versions, state_dir=pool.state_dir, engine_args=pool.engine_args,
                       standby=pool.standby, commands=pool.commands)
