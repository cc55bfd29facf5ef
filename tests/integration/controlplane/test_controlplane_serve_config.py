"""`lifeline controlplane serve` with a bad cutover drivers file stops: exit 2, the file and key, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lifeline.processes import free_port


@pytest.mark.parametrize(("text", "key"), [
    pytest.param('[dns]\nzone = "lifeline.test."\nname = "api.lifeline.test."\nttl_seconds = 60\n', "dns.ttl_seconds",
                 id="unknown-key"),
    pytest.param('[haproxy]\nruntime_api = "127.0.0.1:9999"\ntimeout_s = -1\n[haproxy.servers]\n'
                 '"region:eu" = ["llm/s1"]\n', "haproxy.timeout_s", id="bad-value"),
    pytest.param("[policy\n", "not TOML", id="not-toml"),
    pytest.param(None, "cannot read it", id="missing-file"),
])
def test_serve_with_a_bad_drivers_file_exits_naming_the_file_and_key(tmp_path: Path, text: str | None,
                                                                     key: str) -> None:
    drivers = tmp_path / "drivers.toml"
    if text is not None:
        drivers.write_text(text)
    env = {**os.environ, "LIFELINE_CONTROLPLANE_DATA_DIR": str(tmp_path),
           "LIFELINE_CONTROLPLANE_DATABASE_URL": f"sqlite:///{tmp_path / 'cp.sqlite3'}",
           "LIFELINE_CONTROLPLANE_PORT": str(free_port()),
           "LIFELINE_CONTROLPLANE_CUTOVER_DRIVERS_FILE": str(drivers)}
    done = subprocess.run([sys.executable, "-m", "lifeline.cli", "controlplane", "serve"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"LIFELINE_CONTROLPLANE_CUTOVER_DRIVERS_FILE={drivers}" in done.stderr
    assert key in done.stderr and done.stderr.startswith("error: bad configuration: ")
    assert "Traceback" not in done.stdout + done.stderr
    assert "Uvicorn running" not in done.stdout + done.stderr


def test_cutover_cli_with_a_bad_drivers_file_exits_naming_the_file_and_key(tmp_path: Path) -> None:
    drivers = tmp_path / "drivers.toml"
    drivers.write_text('[anycast]\nprefix = "203.0.113.10/32"\nbirdc_sock = "/run/bird/bird.ctl"\n')
    env = {**os.environ, "LIFELINE_CONTROLPLANE_DATA_DIR": str(tmp_path),
           "LIFELINE_CONTROLPLANE_DATABASE_URL": f"sqlite:///{tmp_path / 'cp.sqlite3'}",
           "LIFELINE_CONTROLPLANE_CUTOVER_DRIVERS_FILE": str(drivers)}
    done = subprocess.run([sys.executable, "-m", "lifeline.cli", "cutover", "rollback", "1", "--reason", "x"],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"LIFELINE_CONTROLPLANE_CUTOVER_DRIVERS_FILE={drivers}" in done.stderr
    assert "anycast.birdc_sock" in done.stderr and "Traceback" not in done.stdout + done.stderr
