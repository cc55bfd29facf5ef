"""A real `holder serve` process for the tests and bench/holder.py: start, wait ready, kill.

Lives beside the holder rather than in `lifeline/processes.py` (another
engineer's file); it needs only the standard library and httpx, and runs the
holder as `python -m holder.cli serve` so it works whether or not the
`lifeline holder` sub-command is mounted.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from common import oneshot_http


@dataclass
class HolderProcess:
    model: Path
    port: int
    state_dir: Path
    shm_dir: Path
    log_path: Path
    extra_args: list[str] = field(default_factory=list)
    process: subprocess.Popen | None = None
    _log: Any = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        cmd = [sys.executable, "-m", "holder.cli", "serve", "--model", str(self.model), "--port", str(self.port),
               "--state-dir", str(self.state_dir), "--shm-dir", str(self.shm_dir), *self.extra_args]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - the child writes to it until kill()
        self.process = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"holder exited with {self.process.returncode}: {self.logs()[-3000:]}")
            try:
                if oneshot_http.get(f"{self.url}/healthz/ready", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"holder not ready within {timeout:.0f}s: {self.logs()[-3000:]}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=30)
        if self._log is not None:
            self._log.close()
            self._log = None

    def state(self) -> dict[str, Any]:
        response = oneshot_http.get(f"{self.url}/v1/state", timeout=5.0)
        response.raise_for_status()
        return response.json()

    def tenant(self, tenant_id: str) -> dict[str, Any] | None:
        return next((t for t in self.state()["tenants"] if t["tenant_id"] == tenant_id), None)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
