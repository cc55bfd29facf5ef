"""Waiting for a child process's HTTP endpoint, shared by the demo, tests and benchmarks."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx


def wait_for_http_ok(url: str, process: subprocess.Popen | None, *, name: str, log_path: Path,
                     timeout: float, interval: float = 0.1) -> None:
    """Poll `url` until it answers 200; fail fast, with the log's tail, if `process` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}: {_tail(log_path)}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
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
