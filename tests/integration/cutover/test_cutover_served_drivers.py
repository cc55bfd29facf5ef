"""The served control plane builds its tier drivers from the drivers file: real BIND9 and HAProxy, through the API.

`create_app` with `cutover_drivers_file` set, as `lifeline controlplane
serve` runs it; the tiers the file leaves out are recorded only.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dns.message
import dns.query
import pytest
from fastapi.testclient import TestClient

from common.clock import ManualClock
from controlplane.app import create_app
from controlplane.config import ControlPlaneSettings
from controlplane.topology.lease import InMemoryLeaseReader
from cutover.drivers_file import CutoverDriverConfigError
from lifeline.daemons import BindServer
from tests.integration.cutover.conftest import REGION_A, REGION_B, HaproxyLab, dns_drivers_table
from tests.integration.cutover.test_cutover_support import topology_two_regions  # noqa: F401 - fixture
from tests.support.answer_contract import AnswerContract

pytestmark = pytest.mark.usefixtures("topology_two_regions")


def _drivers_file(tmp_path: Path, bind: BindServer, lab: HaproxyLab) -> Path:
    path = tmp_path / "drivers.toml"
    path.write_text(f"""
[policy.step_timeouts]
dns = 120

[haproxy]
runtime_api = "127.0.0.1:{lab.haproxy.admin_port}"
[haproxy.servers]
"region:eu/instance:engine-7" = ["{lab.haproxy.backend}/s1"]
""" + dns_drivers_table(bind, tmp_path))
    return path


@pytest.fixture
def served(settings: ControlPlaneSettings, clock: ManualClock, lease_reader: InMemoryLeaseReader, tmp_path: Path,
           bind_server: BindServer, haproxy_lab: HaproxyLab,
           session_factory: Any, answer_contract: AnswerContract) -> Iterator[TestClient]:
    configured = settings.model_copy(update={"cutover_drivers_file": _drivers_file(tmp_path, bind_server,
                                                                                   haproxy_lab)})
    app = create_app(configured, clock=clock, lease_reader=lease_reader)
    with answer_contract.watch(TestClient(app, raise_server_exceptions=False)) as client:
        yield client


def _answer(bind: BindServer) -> list[str]:
    response = dns.query.udp(dns.message.make_query(f"api.{bind.zone}", "A"), bind.host, port=bind.port, timeout=2)
    return sorted(r.address for rrset in response.answer for r in rrset)


def test_served_region_cutover_moves_the_real_dns_record_and_rolls_it_back(
        served: TestClient, as_role: Any, bind_server: BindServer) -> None:
    op = as_role("operator")
    plan = served.post("/api/v1/cutovers", json={"scope": {"kind": "region", "region": "eu"}, "tier": "dns",
                                                 "reason": "eu lost"}, headers=op).json()
    assert [(s["driver"], s["expected_after"]["values"], s["timeout_s"]) for s in plan["steps"]] == [
        ("rfc2136", [REGION_B], 120.0)]  # the [policy] table's per-tier step timeout
    assert plan["recorded_only"] == [] and _answer(bind_server) == [REGION_A]
    done = served.post(f"/api/v1/cutovers/{plan['id']}/execute", json={"idempotency_key": "k"}, headers=op).json()
    assert done["state"] == "completed", done
    assert _answer(bind_server) == [REGION_B]
    assert done["steps"][0]["evidence"]["client_cache_ttl_s"] == 60  # the replaced answer's TTL
    back = served.post(f"/api/v1/cutovers/{plan['id']}/rollback", json={"reason": "eu back"}, headers=op).json()
    assert back["state"] == "rolled_back" and _answer(bind_server) == [REGION_A]


def test_served_instance_cutover_drains_the_real_haproxy_server(served: TestClient, as_role: Any,
                                                              haproxy_lab: HaproxyLab) -> None:
    op = as_role("operator")
    plan = served.post("/api/v1/cutovers", json={"scope": {"kind": "instance", "region": "eu", "name": "engine-7"},
                                                 "tier": "l7", "reason": "engine-7 stalls"}, headers=op).json()
    assert [(s["driver"], s["driver_target"]) for s in plan["steps"]] == [
        ("haproxy", f"backend={haproxy_lab.haproxy.backend},server=s1")]
    done = served.post(f"/api/v1/cutovers/{plan['id']}/execute", json={"idempotency_key": "k"}, headers=op).json()
    assert done["state"] == "completed", done
    assert haproxy_lab.driver.read_state(haproxy_lab.target("s1")).admin_state == "drain"
    assert haproxy_lab.driver.read_state(haproxy_lab.target("s2")).admin_state == "ready"


def test_served_tier_without_a_driver_is_recorded_only_and_says_so(served: TestClient, as_role: Any) -> None:
    op = as_role("operator")
    plan = served.post("/api/v1/cutovers", json={"scope": {"kind": "zone", "region": "eu", "name": "eu-a"},
                                                 "tier": "anycast", "reason": "eu-a"}, headers=op).json()
    assert plan["recorded_only"] == ["anycast"]
    assert [s["driver"] for s in plan["steps"]] == ["recorded-only"]
    done = served.post(f"/api/v1/cutovers/{plan['id']}/execute", json={"idempotency_key": "k"}, headers=op).json()
    assert done["state"] == "completed"
    (event,) = served.get("/api/v1/events", params={"kind": "cutover.step", "routing_tier": "anycast"},
                          headers=op).json()
    assert event["after"]["evidence"]["recorded_only"] is True
    assert "nothing was changed" in event["after"]["evidence"]["message"]


def test_a_bad_drivers_file_stops_the_control_plane_naming_the_key(settings: ControlPlaneSettings,
                                                                   tmp_path: Path) -> None:
    bad = tmp_path / "drivers.toml"
    bad.write_text('[haproxy]\nruntime_api = "nowhere"\n[haproxy.servers]\n"region:eu" = ["be/s1"]\n')
    with pytest.raises(CutoverDriverConfigError, match="haproxy.runtime_api"):
        create_app(settings.model_copy(update={"cutover_drivers_file": bad}))


def test_served_region_fault_escalation_moves_the_real_dns_record_naming_the_evidence(
        served: TestClient, as_role: Any, bind_server: BindServer) -> None:
    op = as_role("operator")
    body = {"fault_id": "slo:eu:42", "scope": {"kind": "region", "region": "eu"},
            "evidence": {"source": "slo burn", "error_rate": 0.31, "window_s": 300}}
    answer = served.post("/api/v1/cutover-escalations", json=body, headers=op)
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert [d["action"] for d in result["decisions"]] == ["cut_over", "contained"]
    (cutover,) = result["cutovers"]
    assert (cutover["tier"], cutover["mode"], cutover["state"]) == ("dns", "automatic", "completed")
    assert cutover["evidence"]["fault"] == {"id": "slo:eu:42", "scope": "region:eu", "source": "slo burn",
                                            "error_rate": 0.31, "window_s": 300}
    assert _answer(bind_server) == [REGION_B]
    again = served.post("/api/v1/cutover-escalations", json=body, headers=op).json()  # the same fault again
    assert [d["action"] for d in again["decisions"]] == ["contained"] and len(again["cutovers"]) == 1
    no_evidence = served.post("/api/v1/cutover-escalations", json={**body, "evidence": {}}, headers=op)
    assert no_evidence.status_code == 422


def test_served_instance_fault_ejects_the_generation_and_drains_haproxy(
        served: TestClient, as_role: Any, haproxy_lab: HaproxyLab) -> None:
    op = as_role("operator")
    body = {"fault_id": "outlier:engine-7:3", "scope": {"kind": "instance", "region": "eu", "name": "engine-7"},
            "zone": "eu-a", "generation": 3, "evidence": {"source": "gateway outlier detection", "failures": 5}}
    result = served.post("/api/v1/cutover-escalations", json=body, headers=op).json()
    assert [d["action"] for d in result["decisions"]] == ["cut_over", "contained"], result
    (cutover,) = result["cutovers"]
    assert sorted(s["driver"] for s in cutover["steps"]) == ["haproxy", "snapshot"]
    snapshot = served.get("/api/v1/snapshot", headers=op).json()
    assert [(e["instance_id"], e["generation"]) for e in snapshot["ejections"]] == [("engine-7", 3)]
    assert haproxy_lab.driver.read_state(haproxy_lab.target("s1")).admin_state == "drain"
