"""The README's first command: `lifeline demo` must keep its promise on a fresh work dir."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def test_demo_survives_engine_kill_with_identical_tokens(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "lifeline.cli", "demo", "--workdir", str(tmp_path), "--max-tokens", "32",
         "--kill-after", "10"],
        check=False, capture_output=True, text=True, timeout=280, env={"COLUMNS": "400", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    # The gateway routes by the served control plane's snapshot and says which version it applied.
    applied = re.search(r"control plane serves snapshot (\d+); gw-eu-west applied snapshot (\d+) "
                        r"\(routing_source snapshot; live: engine-a@eu-west-a, engine-b@eu-west-b\)", out)
    assert applied and int(applied[2]) >= int(applied[1]), out
    assert "identical to reference: yes" in out
    assert "seq 0..31 contiguous: yes" in out
    assert "migrations: 1;" in out
    assert "engine-a is back under generation 2 (was 1)" in out
    assert (tmp_path / "controlplane.sqlite3").exists()
