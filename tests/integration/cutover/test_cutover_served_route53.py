"""The served control plane's dns tier on Route 53: moto's server (an emulator: no DNS server behind it).

`create_app` with a drivers file whose `[dns.route53]` points boto3 at
moto; a region cutover moves the short-TTL external record set to the
takeover region's answer once Route 53 reports the change INSYNC, the
long-TTL internal one stays, and rollback restores the recorded answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from common.clock import ManualClock
from controlplane.app import create_app
from controlplane.config import ControlPlaneSettings
from controlplane.topology.lease import InMemoryLeaseReader
from cutover.drivers.dns import Route53Driver
from tests.integration.cutover.conftest import REGION_A, REGION_B
from tests.integration.cutover.test_cutover_support import topology_two_regions  # noqa: F401 - fixture
from tests.integration.cutover.test_dns_drivers import EXTERNAL, INTERNAL, ZONE, route53_emulator  # noqa: F401
from tests.support.answer_contract import AnswerContract

pytestmark = pytest.mark.usefixtures("topology_two_regions")


@pytest.fixture
def served(settings: ControlPlaneSettings, clock: ManualClock, lease_reader: InMemoryLeaseReader, tmp_path: Path,
           route53_emulator: Any, session_factory: Any,  # noqa: F811 - fixture
           monkeypatch: pytest.MonkeyPatch, answer_contract: AnswerContract) -> Iterator[TestClient]:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")  # moto takes any credentials; boto3 wants some
    drivers = tmp_path / "drivers.toml"
    drivers.write_text(f"""
[dns]
zone = "{ZONE}"
name = "{EXTERNAL.name}"
[dns.route53]
endpoint_url = "{route53_emulator.meta.endpoint_url}"
[dns.regions.eu]
answer = ["{REGION_A}"]
failover_to = "us"
[dns.regions.us]
answer = ["{REGION_B}"]
failover_to = "eu"
""")
    app = create_app(settings.model_copy(update={"cutover_drivers_file": drivers}), clock=clock,
                     lease_reader=lease_reader)
    with answer_contract.watch(TestClient(app, raise_server_exceptions=False)) as client:
        yield client


def test_served_region_cutover_moves_the_route53_record_set_and_rolls_it_back(
        served: TestClient, as_role: Any, route53_emulator: Any) -> None:  # noqa: F811 - fixture
    op = as_role("operator")
    reader = Route53Driver(route53_emulator)
    plan = served.post("/api/v1/cutovers", json={"scope": {"kind": "region", "region": "eu"}, "tier": "dns",
                                                 "reason": "eu lost"}, headers=op).json()
    assert [(s["driver"], s["expected_before"]["values"], s["expected_after"]["values"]) for s in plan["steps"]] == [
        ("route53", [REGION_A], [REGION_B])]
    assert reader.read_state(EXTERNAL).values == (REGION_A,)  # planning changed nothing
    done = served.post(f"/api/v1/cutovers/{plan['id']}/execute", json={"idempotency_key": "k"}, headers=op).json()
    assert done["state"] == "completed", done
    evidence = done["steps"][0]["evidence"]
    assert "INSYNC" in evidence["evidence"] and evidence["client_cache_ttl_s"] == 60
    assert reader.read_state(EXTERNAL).values == (REGION_B,)
    assert reader.read_state(INTERNAL).values == (REGION_A,)  # the long-TTL internal record is not moved
    back = served.post(f"/api/v1/cutovers/{plan['id']}/rollback", json={"reason": "eu back"}, headers=op).json()
    assert back["state"] == "rolled_back", back
    assert reader.read_state(EXTERNAL).values == (REGION_A,)
    (event,) = served.get("/api/v1/events", params={"kind": "cutover.step", "routing_tier": "dns"},
                          headers=op).json()
    assert (event["before"]["state"]["values"], event["after"]["state"]["values"]) == ([REGION_A], [REGION_B])
