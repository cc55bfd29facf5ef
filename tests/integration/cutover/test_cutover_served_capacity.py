"""The served control plane with a drivers file of warm-pool plans and no tier drivers: the capacity rule, and
what automatic escalation does at a tier that file leaves out (recorded only: it holds, it contains nothing).

`assertion.capacity` is checked against the warm-pool plans of the drivers file.

`create_app` with a drivers file whose `[[capacity.plans]]` hold each
region's `lifeline pool plan` inputs: eu (two zones, warm, 300 sequences)
and us (one zone, cold, 90 sequences), 10 sequences per instance. The plans
keep eu-a and eu-b 18 serving + 18 warm each and us-a 11 serving, so eu-a
out leaves 470 sequences for 390 × 1.2 = 468 (allowed) and all of eu out
leaves 110 (refused: nothing changes, the cutover stays planned).
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
from tests.integration.cutover.test_cutover_support import topology_two_regions  # noqa: F401 - fixture
from tests.support.answer_contract import AnswerContract

pytestmark = pytest.mark.usefixtures("topology_two_regions")

PLANS = """
[[capacity.plans]]
region = "eu"
zones = ["eu-a", "eu-b"]
demand_seqs = 300
demand_tokens_per_s = 100
context_tokens = 100
instance_seqs = 10
instance_tokens_per_s = 1000
instance_prefill_tokens_per_s = 10000
[[capacity.plans]]
region = "us"
zones = ["us-a"]
tier = "cold"
demand_seqs = 90
demand_tokens_per_s = 100
context_tokens = 100
instance_seqs = 10
instance_tokens_per_s = 1000
instance_prefill_tokens_per_s = 10000
"""


@pytest.fixture
def served(settings: ControlPlaneSettings, clock: ManualClock, lease_reader: InMemoryLeaseReader, tmp_path: Path,
           session_factory: Any, answer_contract: AnswerContract) -> Iterator[TestClient]:
    drivers = tmp_path / "drivers.toml"
    drivers.write_text(PLANS)
    app = create_app(settings.model_copy(update={"cutover_drivers_file": drivers}), clock=clock,
                     lease_reader=lease_reader)
    with answer_contract.watch(TestClient(app, raise_server_exceptions=False)) as client:
        yield client


def _clusters(client: TestClient, headers: dict[str, str]) -> dict[str, tuple[str, int]]:
    return {c["name"]: (c["state"], c["weight"]) for c in client.get("/api/v1/clusters", headers=headers).json()}


def test_a_region_cutover_beyond_the_plans_capacity_is_refused_and_changes_nothing(
        served: TestClient, as_role: Any) -> None:
    op = as_role("operator")
    before = _clusters(served, op)
    plan = served.post("/api/v1/cutovers", json={"scope": {"kind": "region", "region": "eu"}, "tier": "l7",
                                                 "reason": "eu degraded"}, headers=op).json()
    assert [v["rule"] for v in plan["safety"]] == ["assertion.capacity"]
    assert "capacity left 110 < demand 390" in plan["safety"][0]["message"]
    refused = served.post(f"/api/v1/cutovers/{plan['id']}/execute", json={"idempotency_key": "k"}, headers=op)
    assert refused.status_code == 409
    assert refused.json()["error"]["type"] == "safety_rule_violation"
    assert served.get(f"/api/v1/cutovers/{plan['id']}", headers=op).json()["state"] == "planned"
    assert _clusters(served, op) == before
    (blocked,) = served.get("/api/v1/events", params={"kind": "cutover.blocked"}, headers=op).json()
    assert [v["rule"] for v in blocked["after"]["violations"]] == ["assertion.capacity"]


def test_a_zone_cutover_the_plan_was_sized_for_passes_the_capacity_rule(served: TestClient, as_role: Any) -> None:
    op = as_role("operator")
    plan = served.post("/api/v1/cutovers", json={"scope": {"kind": "zone", "region": "eu", "name": "eu-a"},
                                                 "tier": "l7", "reason": "eu-a degraded"}, headers=op).json()
    assert plan["safety"] == []
    done = served.post(f"/api/v1/cutovers/{plan['id']}/execute", json={"idempotency_key": "k"}, headers=op).json()
    assert done["state"] == "completed", done
    assert _clusters(served, op)["c-eu-a"] == ("draining", 100)


def test_the_cli_checks_the_same_plans(database_url: str, session_factory: Any, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from typer.testing import CliRunner

    from cutover.cli import cutover_app

    drivers = tmp_path / "drivers.toml"
    drivers.write_text(PLANS)
    monkeypatch.setenv("LIFELINE_CONTROLPLANE_DATABASE_URL", database_url)
    monkeypatch.setenv("LIFELINE_CONTROLPLANE_CUTOVER_DRIVERS_FILE", str(drivers))
    runner = CliRunner()
    planned = runner.invoke(cutover_app, ["plan", "--region", "eu", "--reason", "eu degraded", "--json"],
                            catch_exceptions=False)
    assert planned.exit_code == 0, planned.output
    cutover_id = json.loads(planned.output)["id"]
    refused = runner.invoke(cutover_app, ["execute", str(cutover_id)], catch_exceptions=False)
    assert refused.exit_code == 1 and "safety_rule_violation" in refused.output
    assert "capacity left 110" in refused.output


def test_an_automatic_cutover_at_a_tier_with_no_driver_contains_nothing_and_holds(
        served: TestClient, as_role: Any) -> None:
    """No [dns] table: the region fault's dns cutover is recorded only, so the ladder does not call it contained."""
    op = as_role("operator")
    body = {"fault_id": "slo:us:7", "scope": {"kind": "region", "region": "us"},
            "evidence": {"source": "slo burn", "error_rate": 0.4}}
    result = served.post("/api/v1/cutover-escalations", json=body, headers=op).json()
    assert [d["action"] for d in result["decisions"]] == ["cut_over", "hold"], result
    assert "no dns driver is configured" in result["decisions"][1]["reason"]
    (cutover,) = result["cutovers"]
    assert [s["driver"] for s in cutover["steps"]] == ["recorded-only"]
    (stop,) = served.get("/api/v1/events", params={"kind": "cutover.escalation"}, headers=op).json()
    assert (stop["outcome"], stop["after"]["action"]) == ("blocked", "hold")
    assert [a["outcome"] for a in stop["after"]["attempts"]] == ["recorded_only"]
