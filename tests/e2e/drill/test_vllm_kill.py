"""A drill's kill of a stock-vLLM instance takes its engine core too (controlplane/drill/fleet.py).

vLLM's API server leads a session of its own with its engine core as a
child; a SIGKILL of the server alone would leave the core running. A
process pair shaped the same stands in for the pair here: what is tested is
the fleet's signal, not vLLM.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from controlplane.drill.fleet import FileFleet, FleetFile


def fleet(tmp_path: Path) -> FileFleet:
    return FileFleet(FleetFile.model_validate({"gateway_url": "http://gw.invalid", "region": "local", "instances": {
        "vllm-0": {"url": "http://127.0.0.1:1", "served_model": "tiny", "zone": "a", "engine": "vllm",
                   "pid_file": str(tmp_path / "vllm-0.pid")}}}), sleep=lambda s: None)


def test_a_vllm_kill_takes_its_engine_core_too(tmp_path: Path) -> None:
    """A process in a session of its own with a child, as vLLM's API server and its engine core."""
    server = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                               "time.sleep(60)"], start_new_session=True)
    try:
        (tmp_path / "vllm-0.pid").write_text(str(server.pid))
        deadline = time.monotonic() + 10
        children: list[str] = []
        while not children and time.monotonic() < deadline:
            children = Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()
            time.sleep(0.05)
        assert children
        fleet(tmp_path).kill("vllm-0")
        server.wait(10)
        core = int(children[0])
        deadline = time.monotonic() + 10
        while Path(f"/proc/{core}").exists() and time.monotonic() < deadline:
            status = Path(f"/proc/{core}/status").read_text() if Path(f"/proc/{core}/status").exists() else ""
            if "State:\tZ" in status:
                break  # killed, waiting for init to reap it
            time.sleep(0.05)
        assert not Path(f"/proc/{core}").exists() or "State:\tZ" in Path(f"/proc/{core}/status").read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
