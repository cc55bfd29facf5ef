"""`lifeline agent serve` against real engines: corrupted weights answer 200 everywhere and still lose the lease.

Two reference engines the agent holds leases for (`--renew-leases-for`, as
for stock vLLM), a canary recorded from the healthy one, the Redis lease
registry and the control-plane stand-in (`bench/controlplane_standin.py`)
that serves the snapshot (alias → version, the catalog's weights digest)
and collects the agent's events. One engine starts with
`--fault-corrupt-weights` and must never be leased; the other is corrupted
in memory while it serves and must lose its lease within two canary rounds,
with an event that says why.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from common import oneshot_http
from contract.lease import RedisLeaseReader
from lifeline.processes import free_port, scrape_metric, wait_for_http_ok
from warm_pool.probe import record_canary

REDIS_URL = "redis://127.0.0.1:6379/0"
REGION = "r-canary"
# Another loopback address than the default 127.0.0.1: the agent's `--metrics-host` is honoured.
METRICS_HOST = "127.0.0.2"


def until(condition: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(0.1)
    raise AssertionError(f"never: {what}")


class Standin:
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.log_path = workdir / "controlplane.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115
        self.process = subprocess.Popen([sys.executable, "-m", "bench.controlplane_standin", "--port", str(self.port)],
                                        stdout=self._log, stderr=subprocess.STDOUT)
        wait_for_http_ok(f"{self.url}/_standin/state", self.process, name="stand-in", log_path=self.log_path,
                         timeout=60)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def events(self) -> list[dict]:
        return oneshot_http.get(f"{self.url}/_standin/state", timeout=5).json()["events"]

    def close(self) -> None:
        self.process.kill()
        self.process.wait(10)
        self._log.close()


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[Standin]:
    standin = Standin(tmp_path)
    yield standin
    standin.close()


def test_canary_ejects_corrupted_weights_and_the_event_says_why(engine_factory, standin: Standin, tmp_path: Path) -> None:
    healthy = engine_factory("wp-healthy", extra_args=["--enable-fault-admin", "--zone", "z1"])
    corrupt = engine_factory("wp-corrupt", extra_args=["--fault-corrupt-weights", "--zone", "z2"])
    version, record = asyncio.run(record_canary(healthy.url, [11, 12, 13, 14, 15, 16], max_tokens=6, max_ttft_s=30.0))
    canary_file = tmp_path / "canaries.json"
    canary_file.write_text(json.dumps({version: record.model_dump(mode="json")}))

    # the snapshot names the version under alias prod with the catalog's weights digest (generation check)
    identity = oneshot_http.get(f"{healthy.url}/healthz/generation", timeout=5).json()
    oneshot_http.post(f"{standin.url}/_standin/snapshot", timeout=5, json={"version": 1, "models": {"tiny": {
        "aliases": {"prod": {"version": version, "revision": 1}},
        "versions": {version: {"version": version, "fingerprint": "f", "location": "/nowhere",
                               "weights_digest": identity["weights_digest"]}}}}}).raise_for_status()

    prefix = f"test-{uuid.uuid4().hex[:8]}"
    metrics_port = free_port()
    config = tmp_path / "agent.yaml"
    snapshot_cache = tmp_path / "snapshot.json"
    config.write_text(yaml.safe_dump({
        "registry_prefix": prefix, "lease_ttl": 2.0, "probe_interval": 0.5, "probe_timeout": 1.5,
        "canary_per_instance_per_s": 0.5, "snapshot_cache": str(snapshot_cache)}))
    log_path = tmp_path / "agent.log"
    with open(log_path, "ab") as log:
        agent = subprocess.Popen([
            sys.executable, "-m", "lifeline.cli", "agent", "serve", "--region", REGION, "--config", str(config),
            "--controlplane", standin.url, "--registry", REDIS_URL, "--canary-file", str(canary_file),
            "--renew-leases-for", f"{healthy.url},{corrupt.url}", "--port", str(metrics_port),
            "--metrics-host", METRICS_HOST],
            stdout=log, stderr=subprocess.STDOUT)
    reader = RedisLeaseReader.from_url(REDIS_URL, prefix=prefix)
    try:
        def leased() -> set[str]:
            assert agent.poll() is None, log_path.read_text()[-3000:]
            return {lease.instance_id for lease in reader.list_instances(REGION)}

        until(lambda: leased() == {"wp-healthy"}, "the healthy engine holds a lease")
        with pytest.raises(httpx.ConnectError):  # /metrics binds the address it was given, no other
            oneshot_http.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
        assert json.loads(snapshot_cache.read_text())["version"] == 1  # the last good snapshot, on disk

        def verdict(instance_id: str, value: str) -> dict | None:
            return next((e for e in standin.events() if e["kind"] == "probe.verdict"
                         and e["instance_id"] == instance_id and e["detail"]["verdict"] == value), None)

        born_bad = until(lambda: verdict("wp-corrupt", "wrong_output"), "the corrupted engine's verdict reaches the control plane")
        assert born_bad["routing_tier"] == "l7" and born_bad["actor"] == f"agent:{REGION}"
        assert "canary: token" in born_bad["reason"] and "recorded" in born_bad["reason"]
        assert born_bad["detail"]["canary_probes"] == 1  # its admission canary caught it
        assert "wp-corrupt" not in leased()

        def agent_report() -> dict | None:  # PUT /api/v1/agents/{region}, from the agent's loop
            report = oneshot_http.get(f"{standin.url}/_standin/state", timeout=5).json()["agents"].get(REGION)
            instances = {i["instance_id"]: i for i in (report or {}).get("instances", [])}
            return instances if instances.get("wp-corrupt", {}).get("verdict") == "wrong_output" and \
                instances.get("wp-healthy", {}).get("lease_held") else None

        reported = until(agent_report, "the agent's report shows both engines")
        assert not reported["wp-corrupt"]["lease_held"] and reported["wp-corrupt"]["canary_verdict"] == "wrong_output"
        assert reported["wp-healthy"]["canary_verdict"] == "ok" and reported["wp-healthy"]["origin"] == "external"
        assert reported["wp-healthy"]["lease_generation"] is not None

        # corrupt the serving one in memory: it keeps answering 200 on every health level
        oneshot_http.post(f"{healthy.url}/admin/faults", json={"corrupt_weights": True}, timeout=10).raise_for_status()
        canaries_at_fault = scrape_metric(f"http://{METRICS_HOST}:{metrics_port}/metrics",
                                          "lifeline_agent_instance_canaries", {"instance": "wp-healthy"})
        assert oneshot_http.get(f"{healthy.url}/healthz/ready", timeout=5).status_code == 200
        until(lambda: "wp-healthy" not in leased(), "the corrupted serving engine loses its lease")
        ejected = until(lambda: verdict("wp-healthy", "wrong_output"), "its verdict reaches the control plane")
        assert "canary: token" in ejected["reason"]
        # within two canary rounds of the fault (one may have been in flight when it struck)
        assert ejected["detail"]["canary_probes"] <= canaries_at_fault + 2
    finally:
        agent.terminate()
        agent.wait(30)
        reader.redis.close()
