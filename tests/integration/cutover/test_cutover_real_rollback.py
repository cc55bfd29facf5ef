"""A later tier that cannot verify rolls back the earlier tiers' changes at the real daemons, last first.

The served control plane (`create_app` with a drivers file) shifts zone
eu-a: the snapshot drains its cluster, a real HAProxy drains its server,
then zone-a's ExaBGP (SIGSTOPped: it never acknowledges the withdrawal)
should withdraw the prefix at a real BIRD. That step fails, and the
rollback puts HAProxy's server back to ready and the cluster back to
active, each read back from the system and evented; the anycast revert
cannot be confirmed either while the speaker hangs, so the cutover ends
`failed` (and the shift with it) until `rollback` is retried once the
speaker runs again: then both zones' paths are at BIRD and it is
`rolled_back`.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from common.clock import ManualClock
from controlplane.app import create_app
from controlplane.config import ControlPlaneSettings
from controlplane.topology.lease import InMemoryLeaseReader
from tests.integration.cutover.conftest import AnycastLab, HaproxyLab
from tests.integration.cutover.test_cutover_support import topology_two_regions  # noqa: F401 - fixture
from tests.support.answer_contract import AnswerContract

pytestmark = pytest.mark.usefixtures("topology_two_regions")

LAB_ZONE = {"eu-a": "zone-a", "eu-b": "zone-b"}


def _drivers_file(tmp_path: Path, anycast: AnycastLab, haproxy: HaproxyLab) -> Path:
    zones = "".join(f"""
[[anycast.zones]]
region = "eu"
zone = "{zone}"
next_hop = "{anycast.targets[name].next_hop}"
command_fifo = "{anycast.speakers[name].command_fifo}"
ack_fifo = "{anycast.speakers[name].ack_fifo}"
""" for zone, name in LAB_ZONE.items())
    path = tmp_path / "drivers.toml"
    path.write_text(f"""
[policy]
step_timeout = 2
[haproxy]
runtime_api = "127.0.0.1:{haproxy.haproxy.admin_port}"
[haproxy.servers]
"region:eu/zone:eu-a" = ["{haproxy.haproxy.backend}/s1"]
[anycast]
prefix = "{anycast.targets["zone-a"].prefix}"
birdc_socket = "{anycast.router.socket_path}"
ack_timeout_s = 0.3
{zones}""")
    return path


@pytest.fixture
def served(settings: ControlPlaneSettings, clock: ManualClock, lease_reader: InMemoryLeaseReader, tmp_path: Path,
           anycast_lab: AnycastLab, haproxy_lab: HaproxyLab,
           session_factory: Any, answer_contract: AnswerContract) -> Iterator[TestClient]:
    configured = settings.model_copy(update={"cutover_drivers_file": _drivers_file(tmp_path, anycast_lab,
                                                                                   haproxy_lab)})
    app = create_app(configured, clock=clock, lease_reader=lease_reader)
    with answer_contract.watch(TestClient(app, raise_server_exceptions=False)) as client:
        yield client


def _next_hops(lab: AnycastLab) -> list[str]:
    paths, _ = lab.driver.observer.paths(lab.targets["zone-a"].prefix)
    return sorted(p.next_hop for p in paths)


def test_a_tier_that_cannot_verify_rolls_back_haproxy_and_the_snapshot_and_the_retry_restores_bird(
        served: TestClient, as_role: Any, anycast_lab: AnycastLab, haproxy_lab: HaproxyLab) -> None:
    op = as_role("operator")
    both = _next_hops(anycast_lab)
    speaker = anycast_lab.speakers["zone-a"]
    assert speaker.process is not None and len(both) == 2
    os.kill(speaker.process.pid, signal.SIGSTOP)  # zone-a's ExaBGP hangs: nothing it is asked is acknowledged
    try:
        answer = served.post("/api/v1/zonal-shifts", headers=op, json={
            "region": "eu", "zone": "eu-a", "expires_in": 3600, "reason": "eu-a packet loss"})
        assert answer.status_code == 201, answer.text
        shift = answer.json()
        assert shift["end_reason"] == "failed"
        cutover = served.get(f"/api/v1/cutovers/{shift['cutover_id']}", headers=op).json()
        assert cutover["state"] == "failed", cutover
        assert "could not be restored" in cutover["failure"]
        assert [(s["tier"], s["driver"], s["outcome"], s["status"]) for s in cutover["steps"]] == [
            ("l7", "snapshot", "succeeded", "reverted"),
            ("l7", "haproxy", "succeeded", "reverted"),
            ("anycast", "exabgp", "failed", "revert_failed"),
        ]
        # What was done is undone at the real systems, read back from them.
        assert haproxy_lab.new_driver().read_state(haproxy_lab.target("s1")).admin_state == "ready"
        clusters = {c["name"]: c["state"] for c in served.get("/api/v1/clusters", headers=op).json()}
        assert clusters["c-eu-a"] == "active"
        reverts = served.get("/api/v1/events", params={"kind": "cutover.rollback_step"}, headers=op).json()
        assert sorted((e["routing_tier"], e["after"]["driver"], e["outcome"]) for e in reverts) == [
            ("anycast", "exabgp", "failed"), ("l7", "haproxy", "succeeded"), ("l7", "snapshot", "succeeded")]
    finally:
        os.kill(speaker.process.pid, signal.SIGCONT)

    retried = served.post(f"/api/v1/cutovers/{shift['cutover_id']}/rollback", json={"reason": "speaker back"},
                          headers=op).json()
    assert retried["state"] == "rolled_back", retried
    assert [s["status"] for s in retried["steps"]] == ["reverted", "reverted", "reverted"]
    assert _next_hops(anycast_lab) == both
