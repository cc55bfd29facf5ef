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
        check=False, capture_output=True, text=True, timeout=300, env={"COLUMNS": "400", "PATH": "/usr/bin:/bin"},
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
    # A zonal shift: the other zone serves everything, steady traffic never breaks, the l7 events are listed.
    shift = re.search(r"zonal shift of eu-west-a \(cutover \d+ completed in [\d.]+ s, tiers \['l7'\]\): gw-eu-west "
                      r"routes to \['eu-west-b-0'\]; while shifted (\d+) tokens were generated in eu-west-b, 0 in "
                      r"eu-west-a; steady traffic through the shift: (\d+) streams ok, 0 broken;", out)
    assert shift and int(shift[1]) > 0 and int(shift[2]) > 0, out
    assert "cutover.step(l7)" in out and "cutover.rollback_step(l7)" in out
    # An instance drill through the drill API passes, writes its report and measures the SLO.
    drill = re.search(r"instance drill run (\d+) \(demo-weekly-kill, SIGKILL eu-west-a-0 under traffic\) passed: "
                      r".*token RPO 0, requests lost 0,.*report (\S+\.md); SLO request_rto_s: unverified → measured", out)
    assert drill and Path(drill[2]).is_file(), out
    assert "l7 ran for real" in out
    assert (tmp_path / "controlplane.sqlite3").exists()

