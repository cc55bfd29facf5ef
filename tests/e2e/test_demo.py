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
    applied = re.findall(r"(gw-eu-west|gw-us-east) applied snapshot (\d+) \(routing_source snapshot; live: (.*?)\)", out)
    served = int(re.search(r"control plane serves snapshot (\d+);", out)[1])  # type: ignore[index]
    assert {(gateway, int(version) >= served, live) for gateway, version, live in applied} == {
        ("gw-eu-west", True, "eu-west-a-0@eu-west-a, eu-west-b-0@eu-west-b"),
        ("gw-us-east", True, "us-east-a-0@us-east-a, us-east-b-0@us-east-b"),
    }, out
    assert "identical across regions: yes" in out
    assert "identical to reference: yes" in out
    assert "seq 0..31 contiguous: yes" in out
    assert "migrations: 1;" in out
    assert "eu-west-a-0 is back under generation 2 (was 1)" in out
    assert (tmp_path / "controlplane.sqlite3").exists()
