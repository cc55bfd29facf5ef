"""A real `lifeline engine serve` subprocess, for tests that kill and hang engines."""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path


from lifeline.processes import wait_for_http_ok


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

    def logs(self) -> str:
        return self.log_path.read_text()
