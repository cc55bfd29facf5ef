"""RPO_weight and RPO_context in the SLO document, on SQLite and PostgreSQL, through the API.

RPO_weight is measured when the document is generated, from the catalog's
`prod` history and the regions' fresh gateway and agent reports (written
through their own endpoints); RPO_context is the value the latest drill run
reported (`measured.rpo_context_tokens`), unverified while no run carries one.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from contract.events import AgentInstance, AgentReport, GatewayReport, LiveEndpoint
from controlplane.auth import service as auth_service
from controlplane.auth.roles import Role
from controlplane.db import session_scope
from controlplane.drill import service as drill_service
from controlplane.drill.schemas import DrillSpec
from controlplane.drill.states import DrillRunEvent
from tests.support.controlplane_testing import write_artifact

CATALOG = "/api/v1/catalog/models/tiny"


def figures(client, as_role, fmt: str = "json") -> Any:
    response = client.get("/api/v1/slo/tiny", params={"format": fmt}, headers=as_role("viewer"))
    assert response.status_code == 200, response.text
    if fmt != "json":
        return response.text
    return {f["metric"]: f for entry in response.json()["triple"] for f in entry["figures"]}


@pytest.fixture
def catalog(client, as_role, tmp_path: Path) -> None:
    """tiny v1, v2, v3 registered; prod moved v1 → v2 → v3; regions eu and us declared."""
    operator = as_role("operator")
    for version in ("v1", "v2", "v3"):
        response = client.post(f"{CATALOG}/versions", json={"version": version,
                                                            "location": str(write_artifact(tmp_path / version))},
                               headers=operator)
        assert response.status_code == 201, response.text
        moved = client.post(f"{CATALOG}/aliases/prod/promote", json={"version": version, "reason": "t"},
                            headers=operator)
        assert moved.status_code == 200, moved.text
    for region in ("eu", "us"):
        assert client.post("/api/v1/regions", json={"name": region}, headers=operator).status_code == 201


def gateway_report(client, as_role, clock, region: str, *versions: str) -> None:
    epoch = client.get("/api/v1/snapshot", headers=as_role("gateway")).json()["controlplane_epoch"]
    now = clock.utcnow()
    body = GatewayReport(replica_id=f"gw-{region}", region=region, zone=f"{region}-a", snapshot_version=1,
                         snapshot_epoch=epoch, snapshot_applied_at=now, routing_source="snapshot", reported_at=now,
                         live_endpoints=[LiveEndpoint(instance_id=f"{region}-{v}", generation=1, version=v,
                                                      zone=f"{region}-a") for v in versions])
    response = client.put(f"/api/v1/gateways/gw-{region}", json=body.model_dump(mode="json"),
                          headers=as_role("gateway"))
    assert response.status_code == 200, response.text


def agent_report(client, headers, clock, region: str, version: str, verdict: str = "ok") -> None:
    now = clock.utcnow()
    body = AgentReport(region=region, agent_id=f"agent-{region}", sent_at=now, snapshot_version=1, instances=[
        AgentInstance(instance_id=f"{region}-0", zone=f"{region}-a", version=version, url="http://e", origin="pool",
                      pool_state="serving", verdict=verdict, verdict_since=now)])
    response = client.put(f"/api/v1/agents/{region}", json=body.model_dump(mode="json"), headers=headers)
    assert response.status_code == 200, response.text


@pytest.fixture
def agent(session_factory, clock) -> dict[str, str]:
    with session_scope(session_factory) as session:
        _, secret = auth_service.create_token(session, name="agent", role=Role.AGENT, created_by="t", clock=clock)
    return {"Authorization": f"Bearer {secret}"}


def declare_target(session_factory, clock, **targets: float) -> None:
    spec = DrillSpec.model_validate({"name": "weights-lag", "model": "tiny", "scope": "region",
                                     "fault": "controlplane_down", "blast_radius": {"region": "us"},
                                     "targets": targets})
    with session_scope(session_factory) as session:
        drill_service.define(session, spec=spec, actor="t", clock=clock)


def test_rpo_weight_is_measured_from_the_catalog_and_fresh_reports(client, as_role, agent, catalog,
                                                                   session_factory, clock):
    silent = figures(client, as_role)["rpo_weight_versions"]
    assert (silent["status"], silent["measured"]) == ("unverified", None)
    assert "no fresh gateway or agent report from region(s) ['eu', 'us']" in silent["why"]

    gateway_report(client, as_role, clock, "eu", "v3")
    agent_report(client, agent, clock, "us", "v2")
    untargeted = figures(client, as_role)["rpo_weight_versions"]
    assert (untargeted["status"], untargeted["measured"]) == ("unverified", 1.0)  # a figure, but no objective
    assert untargeted["why"].startswith("no drill declares a target for it")

    declare_target(session_factory, clock, rpo_weight_versions=1)
    measured = figures(client, as_role)["rpo_weight_versions"]
    assert (measured["status"], measured["measured"], measured["target"], measured["source"]) == (
        "measured", 1.0, 1.0, "reports")
    assert "eu: 0 behind (gateway gw-eu)" in measured["why"] and "us: 1 behind (agent agent-us)" in measured["why"]
    assert measured["run_id"] is None
    assert "| RPO_weight: how far the standby's weights may lag | 1 versions | 1 versions (measured" in figures(
        client, as_role, "md")
    html = figures(client, as_role, "html")
    assert "<em>unverified</em>" in html and "1 versions (measured" in html

    agent_report(client, agent, clock, "us", "v1")  # the standby falls two versions behind
    behind = figures(client, as_role)["rpo_weight_versions"]
    assert (behind["status"], behind["measured"]) == ("unverified", 2.0)
    assert "over the target of 1" in behind["why"]

    agent_report(client, agent, clock, "us", "v3", verdict="wrong_output")  # failing its probe: serves nothing
    assert "no fresh gateway or agent report from region(s) ['us']" not in figures(client, as_role)[
        "rpo_weight_versions"]["why"]
    assert figures(client, as_role)["rpo_weight_versions"]["status"] == "unverified"

    gateway_report(client, as_role, clock, "us", "v3")
    assert figures(client, as_role)["rpo_weight_versions"]["measured"] == 0.0
    clock.advance(timedelta(seconds=31))  # every report is stale: no evidence left
    stale = figures(client, as_role)["rpo_weight_versions"]
    assert (stale["status"], stale["measured"]) == ("unverified", None) and "no fresh" in stale["why"]


def _passed_run(session_factory, clock, measured: dict[str, float | None]) -> int:
    with session_scope(session_factory) as session:
        definition = drill_service.get_definition_or_raise(session, name="weights-lag")
        run = drill_service.create_run(session, definition=definition, trigger="manual", actor="t", clock=clock)
        run = drill_service.approve(session, run_id=run.id, actor="t", clock=clock)
        run = drill_service.start(session, run_id=run.id, fault_target="controlplane:us", actor="t", clock=clock)
        run = drill_service.advance(session, run=run, event=DrillRunEvent.FAULT_CLEARED, clock=clock)
        run = drill_service.advance(session, run=run, event=DrillRunEvent.PASS, clock=clock,
                                    report={"measured": measured})
        return run.id


def test_rpo_context_comes_from_the_drill_report_and_stays_unverified_without_it(client, as_role,
                                                                                 session_factory, clock):
    declare_target(session_factory, clock, rpo_context_tokens=64)
    never = figures(client, as_role)["rpo_context_tokens"]
    assert (never["status"], never["target"], never["why"]) == ("unverified", 64.0, "never drilled")

    # A passed run whose traffic used no sessions: its report carries no value, so no figure.
    unmeasured = _passed_run(session_factory, clock, {"rpo_context_tokens": None, "request_rto_s": 0.1})
    context = figures(client, as_role)["rpo_context_tokens"]
    assert (context["status"], context["measured"], context["run_id"]) == ("unverified", None, unmeasured)
    assert "did not measure it" in context["why"] and "traffic.sessions" in context["why"]

    measured = _passed_run(session_factory, clock, {"rpo_context_tokens": 40.0})
    context = figures(client, as_role)["rpo_context_tokens"]
    assert (context["status"], context["measured"], context["run_id"], context["unit"]) == (
        "measured", 40.0, measured, "tokens")
    assert f"(run {measured}, weights-lag v1)" in figures(client, as_role, "md")

    over = _passed_run(session_factory, clock, {"rpo_context_tokens": 100.0})  # lost more than the target allows
    context = figures(client, as_role)["rpo_context_tokens"]
    assert (context["status"], context["measured"], context["run_id"]) == ("unverified", 100.0, over)
