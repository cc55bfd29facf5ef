"""Real Lifeline processes for the demo, the benchmarks and the tests: start, wait, kill.

One module, importable from the installed package, so `lifeline demo`,
`bench/*.py` and the test suites start engines and gateways the same way
(and none of them imports the tests package). Each process runs
`python -m lifeline.cli …` with its log in a file whose tail appears in
every start-up error.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from common import oneshot_http
from common.ports import free_port  # re-exported: every starter takes its ports here

def wait_for_http_ok(url: str, process: subprocess.Popen | None, *, name: str, log_path: Path,
                     timeout: float, interval: float = 0.1) -> None:
    """Poll `url` until it answers 200; fail fast, with the log's tail, if `process` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}: {_tail(log_path)}")
        try:
            if oneshot_http.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(interval)
    raise TimeoutError(f"{name} did not answer {url} within {timeout:.0f}s: {_tail(log_path)}")


def _tail(log_path: Path, chars: int = 3000) -> str:
    try:
        return log_path.read_text(errors="replace")[-chars:]
    except OSError:
        return f"(no log at {log_path})"


# Models are deterministic, so one build per preset and seed serves the whole run.
MODEL_CACHE = Path(os.environ.get("LIFELINE_TEST_MODEL_CACHE", Path(__file__).resolve().parent.parent / ".lifeline" / "test-models"))


def built_model(preset: str, seed: int) -> Path:
    """The model `lifeline model build` makes for (preset, seed), built once into the cache and again whenever
    the build itself changed (its source is the stamp: a new chat template must not meet an old cached copy)."""
    import fcntl

    MODEL_CACHE.mkdir(parents=True, exist_ok=True)
    target = MODEL_CACHE / f"{preset}-seed{seed}"
    stamp = target.with_name(target.name + ".build")  # beside the model: inside, it would change its digest
    wanted = _build_fingerprint()
    # One builder at a time (parallel test workers ask for the same model at once); the others then find it.
    with open(target.with_name(target.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fresh = (target / "model.safetensors.index.json").exists() and stamp.exists() \
            and stamp.read_text() == wanted
        if not fresh:
            from engine.model_build import build_model  # torch: only when a model must be built

            partial = target.with_name(target.name + f".partial-{os.getpid()}")
            shutil.rmtree(partial, ignore_errors=True)
            build_model(partial, preset_name=preset, seed=seed)
            shutil.rmtree(target, ignore_errors=True)
            partial.rename(target)
            stamp.write_text(wanted)
    return target


def _build_fingerprint() -> str:
    """The build's inputs: the source of the modules that decide what a model directory holds."""
    import hashlib

    engine_dir = Path(__file__).resolve().parent.parent / "engine"
    digest = hashlib.sha256()
    for name in ("model_build.py", "presets.py", "corpus.py"):
        digest.update((engine_dir / name).read_bytes())
    return digest.hexdigest()


@dataclass
class EngineProcess:
    model: Path
    port: int
    instance_id: str
    state_dir: Path
    log_path: Path
    extra_args: list[str] = field(default_factory=list)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        cmd = [
            sys.executable, "-m", "lifeline.cli", "engine", "serve",
            "--model", str(self.model), "--port", str(self.port),
            "--instance-id", self.instance_id, "--state-dir", str(self.state_dir),
            "--torch-threads", "1", *self.extra_args,
        ]
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 120.0) -> None:
        wait_for_http_ok(f"{self.url}/healthz/ready", self.process, name=f"engine {self.instance_id}",
                         log_path=self.log_path, timeout=timeout)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=15)
        if hasattr(self, "_log"):
            self._log.close()

    def restart(self) -> None:
        self.kill()
        self.start()
        self.wait_ready()

    def wait_exit(self, timeout: float = 60.0) -> int:
        """The exit status; a process still running after `timeout` fails with its log's tail (where a stuck
        drain leaves every thread's stack, engine.drain)."""
        assert self.process is not None
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"engine {self.instance_id} still running {timeout:.0f} s after the signal:\n"
                                 f"{_tail(self.log_path, 8000)}") from None

    def logs(self) -> str:
        return self.log_path.read_text()


LEASE_TOKEN = "test-lease-token"


def gateway_config(model_dir: Path, *, alias: str = "tiny", version: str | None = None, **sections: Any) -> dict[str, Any]:
    """A config dict for one model; `sections` override top-level keys (registry, recovery, …)."""
    config: dict[str, Any] = {
        "models": [{"alias": alias, "version": version or model_dir.name, "model_dir": str(model_dir)}],
        "registry": {"kind": "memory", "token": LEASE_TOKEN, "ttl": 2.0},
        "recovery": {"stall_timeout": 1.5, "first_token_timeout": 20.0, "connect_timeout": 1.0},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config


@dataclass
class GatewayProcess:
    config: dict[str, Any]
    port: int
    workdir: Path
    replica_id: str = "gateway-0"
    process: subprocess.Popen | None = None
    _log: Any = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.replica_id}.log"

    def registry_args(self) -> list[str]:
        """Engine flags that make an engine renew its lease against this gateway."""
        return ["--registry", self.url, "--registry-token", LEASE_TOKEN]

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_path = self.workdir / f"{self.replica_id}.yaml"
        config_path.write_text(yaml.safe_dump(self.config))
        cmd = [sys.executable, "-m", "lifeline.cli", "gateway", "serve", "--config", str(config_path),
               "--port", str(self.port), "--replica-id", self.replica_id]
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_live(self, timeout: float = 60.0) -> None:
        wait_for_http_ok(f"{self.url}/healthz/live", self.process, name=f"gateway {self.replica_id}",
                         log_path=self.log_path, timeout=timeout)

    def wait_routable(self, alias: str, count: int, timeout: float = 60.0) -> None:
        """Until `count` endpoints for `alias` hold live leases (and are not suppressed)."""
        deadline = time.monotonic() + timeout
        seen = None
        while time.monotonic() < deadline:
            try:
                seen = oneshot_http.get(f"{self.url}/healthz/ready", timeout=1.0).json().get("routable_endpoints", {})
                if seen.get(alias, 0) >= count:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"gateway never had {count} endpoints for {alias}: {seen}\n{self.logs()[-3000:]}")

    def leases(self) -> dict[str, int]:
        """instance id → live generation, from the authenticated lease endpoint."""
        response = oneshot_http.get(f"{self.url}/lifeline/v1/leases", headers={"Authorization": f"Bearer {LEASE_TOKEN}"}, timeout=5.0)
        response.raise_for_status()
        return {lease["instance_id"]: lease["generation"] for lease in response.json()["leases"]}

    def wait_generation_above(self, instance_id: str, generation: int, timeout: float = 60.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            current = self.leases().get(instance_id, 0)
            if current > generation:
                return current
            time.sleep(0.05)
        raise TimeoutError(f"{instance_id} never registered above generation {generation}")

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        """Sum of a counter/gauge sample over series matching `labels`."""
        return scrape_metric(f"{self.url}/metrics", name, labels)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=15)
        if self._log is not None:
            self._log.close()
            self._log = None

    def logs(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""


def scrape_metric(url: str, name: str, labels: dict[str, str] | None = None) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(oneshot_http.get(url, timeout=5.0).text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in (labels or {}).items()):
                total += sample.value
    return total


@dataclass
class ControlPlaneProcess:
    """`lifeline controlplane serve` on a free port, its SQLite database in `workdir`.

    `start()` and `create_token()` run `lifeline controlplane migrate` first
    (idempotent), so a stopped control plane starts again on the same
    database and port, as a restarted one would. `cli()` runs any
    `lifeline …` command (tokens, the catalog) against the same database;
    those talk to the database, not the API, so they work while the server
    is stopped. `env` adds or overrides LIFELINE_CONTROLPLANE_* settings (a
    lease registry, a stale-after, …).
    """

    workdir: Path
    port: int = field(default_factory=free_port)
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "controlplane.log"

    def environment(self) -> dict[str, str]:
        return {
            **os.environ,
            "LIFELINE_CONTROLPLANE_DATA_DIR": str(self.workdir),
            "LIFELINE_CONTROLPLANE_DATABASE_URL": f"sqlite:///{self.workdir / 'controlplane.sqlite3'}",
            "LIFELINE_CONTROLPLANE_PORT": str(self.port),
            **self.env,
        }

    def cli(self, *args: str) -> str:
        """`lifeline ARGS` against this control plane's database; its stdout, or RuntimeError with both streams."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([sys.executable, "-m", "lifeline.cli", *args], capture_output=True, text=True,
                              env=self.environment(), check=False)
        if done.returncode != 0:
            raise RuntimeError(f"lifeline {' '.join(args)} exited with {done.returncode}:\n{done.stdout}{done.stderr}")
        return done.stdout

    def migrate(self) -> None:
        """`lifeline controlplane migrate`: the schema at head (a no-op when it is)."""
        self.cli("controlplane", "migrate")

    def create_token(self, role: str, name: str | None = None) -> str:
        """A new API token of `role` (viewer | operator | admin | gateway); the secret, printed once by the CLI."""
        self.migrate()
        return self.cli("controlplane", "token", "create", "--role", role, "--name", name or role).splitlines()[0].strip()

    def start(self) -> None:
        self.migrate()
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen([sys.executable, "-m", "lifeline.cli", "controlplane", "serve"],
                                        stdout=log, stderr=subprocess.STDOUT, env=self.environment())
        log.close()

    def wait_ready(self, timeout: float = 60.0) -> None:
        wait_for_http_ok(f"{self.url}/healthz/ready", self.process, name="control plane", log_path=self.log_path,
                         timeout=timeout)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def logs(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""
