"""A real `lifeline engine serve` subprocess, for tests that kill and hang engines."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx


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
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"engine {self.instance_id} exited: {self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/healthz/ready", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"engine {self.instance_id} not ready: {self.log_path.read_text()[-3000:]}")

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

    def logs(self) -> str:
        return self.log_path.read_text()
