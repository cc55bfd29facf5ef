"""The agent reports its view of the region; the control plane keeps the last one per region; both databases.

Written through the agent's own sender (`warm_pool.report`, httpx to the
control plane's ASGI app) and read back through `GET /api/v1/agents`: the
one contract (`contract.events.AgentReport`) on both sides, on the real store.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from common.clock import ManualClock
from contract.events import AgentInstance, AgentReport, DataPlaneEvent, EventBatch
from tests.unit.warm_pool.test_pool_agent import Fleet, ScriptedEngine, make_agent, settle


@pytest.fixture
def agent_token(tokens: dict[str, str], session_factory: Any, clock: ManualClock) -> str:
    from controlplane.auth import service as auth_service
    from controlplane.auth.roles import Role
    from controlplane.db import session_scope

    with session_scope(session_factory) as session:
        _, secret = auth_service.create_token(session, name="test-agent", role=Role.AGENT, created_by="test",
                                              clock=clock)
    return secret


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def report(region: str, at: datetime, *, agent_id: str = "host-1:42", version: int | None = 3,
           instances: list[AgentInstance] | None = None, epoch: str | None = None) -> dict[str, Any]:
    if instances is None:
        instances = [AgentInstance(instance_id="e1", zone="z1", version="v1", url="http://e1", origin="pool",
                                   pool_state="serving", verdict="ok", verdict_since=at, lease_held=True,
                                   lease_generation=4, canary_verdict="ok", canary_at=at, canaries=2)]
    return AgentReport(region=region, agent_id=agent_id, sent_at=at, snapshot_version=version,
                       snapshot_epoch=epoch, instances=instances).model_dump(mode="json")


async def test_agent_report_written_by_the_agent_is_read_back_and_goes_stale(
    client: TestClient, as_role: Any, agent_token: str, clock: ManualClock, settings: Any, tmp_path: Path
) -> None:
    from warm_pool.report import ReportSender

    fleet = Fleet()
    agent, registry, _ = make_agent(fleet, clock, agent_id="agent-r1", pool={
        "model": "m", "versions": {"v1": str(tmp_path)}, "state_dir": str(tmp_path),
        "zones": {"z1": {"serving": 1, "warm": 0}, "z2": {"serving": 0, "warm": 1}}})
    fleet.engines["e-ext"] = ScriptedEngine("e-ext")
    await settle(agent, clock, 4)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=client.app), base_url="http://cp") as http:
        agent.reporter = ReportSender(http, "http://cp", token=agent_token)
        assert await agent.send_report() == "sent"

    viewer = as_role("viewer")
    [shown] = client.get("/api/v1/agents", headers=viewer).json()
    assert (shown["region"], shown["agent_id"], shown["stale"], shown["age_s"]) == ("r1", "agent-r1", False, 0.0)
    assert shown["reported_by"] == "token:test-agent#4"
    lease = {lease.instance_id: lease.generation for lease in await registry.live()}
    assert sorted((i["zone"], i["pool_state"], i["verdict"], i["lease_held"], i["lease_generation"])
                  for i in shown["instances"]) == [
        ("z1", "serving", "ok", True, next(iter(lease.values()))), ("z2", "warm", "ok", False, None)]
    assert all(i["canary_verdict"] == "ok" and i["canary_at"] for i in shown["instances"])
    assert (shown["snapshot_version"], shown["foreign_epoch"]) == (None, False)  # no snapshot yet: nothing to doubt

    clock.advance(settings.agent_report_stale_after + timedelta(seconds=1))
    [stale] = client.get("/api/v1/agents", params={"region": "r1"}, headers=viewer).json()
    assert stale["stale"] is True
    assert client.get("/api/v1/agents", params={"region": "r2"}, headers=viewer).json() == []


def test_a_newer_report_replaces_the_last_and_an_older_one_is_ignored(
    client: TestClient, as_role: Any, agent_token: str, clock: ManualClock
) -> None:
    now, agent = clock.utcnow(), bearer(agent_token)
    assert client.put("/api/v1/agents/eu", json=report("eu", now, version=5), headers=agent).status_code == 200
    newer = report("eu", now + timedelta(seconds=1), agent_id="host-2:7", version=6, instances=[])
    assert client.put("/api/v1/agents/eu", json=newer, headers=agent).json()["agent_id"] == "host-2:7"
    late = client.put("/api/v1/agents/eu", json=report("eu", now - timedelta(seconds=1), version=4), headers=agent)
    assert late.status_code == 200 and late.json()["snapshot_version"] == 6
    assert client.put("/api/v1/agents/us", json=report("us", now), headers=agent).status_code == 200
    shown = client.get("/api/v1/agents", headers=as_role("viewer")).json()
    assert [(r["region"], r["snapshot_version"], len(r["instances"])) for r in shown] == [("eu", 6, 0), ("us", 3, 1)]


def test_a_version_from_another_control_plane_epoch_is_shown_foreign(
    client: TestClient, as_role: Any, agent_token: str, clock: ManualClock
) -> None:
    """As for gateways: a snapshot version counts only within the database (epoch) that issued it."""
    now, agent, viewer = clock.utcnow(), bearer(agent_token), as_role("viewer")
    ours = client.get("/api/v1/snapshot", headers=agent).json()["controlplane_epoch"]
    assert client.put("/api/v1/agents/eu", json=report("eu", now, epoch=ours), headers=agent).status_code == 200
    elsewhere = report("us", now, version=900, epoch="0f0f0f0f-dead-4bee-8bad-000000000099")
    answered = client.put("/api/v1/agents/us", json=elsewhere, headers=agent).json()
    assert answered["foreign_epoch"] is True
    shown = client.get("/api/v1/agents", headers=viewer).json()
    assert [(r["region"], r["snapshot_epoch"] == ours, r["foreign_epoch"]) for r in shown] == [
        ("eu", True, False), ("us", False, True)]


def test_bad_reports_are_refused_change_nothing_and_only_agents_report(
    client: TestClient, as_role: Any, agent_token: str, clock: ManualClock
) -> None:
    now, agent = clock.utcnow(), bearer(agent_token)
    good = report("eu", now)
    assert client.put("/api/v1/agents/eu", json=good, headers=agent).status_code == 200
    twice = AgentInstance(instance_id="e1", zone="z1", version="v1", url="http://e1", origin="registry")
    bad = {
        "region in the path differs": ("/api/v1/agents/us", report("eu", now + timedelta(seconds=1)), "region"),
        "an instance twice": ("/api/v1/agents/eu", report("eu", now + timedelta(seconds=1), instances=[twice, twice]),
                              "instances"),
        "from the far future": ("/api/v1/agents/eu", report("eu", now + timedelta(hours=1)), "sent_at"),
        "a NUL byte": ("/api/v1/agents/eu", report("eu", now + timedelta(seconds=1), agent_id="a\x00b"), "agent_id"),
    }
    for case, (path, body, param) in bad.items():
        response = client.put(path, json=body, headers=agent)
        assert (response.status_code, response.json()["error"]["type"]) == (422, "invalid_request"), case
        assert param in response.json()["error"]["param"], case
    assert client.put("/api/v1/agents/eu", json={**good, "surprise": 1}, headers=agent).status_code == 422
    unknown_verdict = {**good, "instances": [{**good["instances"][0], "verdict": "fine"}]}
    assert client.put("/api/v1/agents/eu", json=unknown_verdict, headers=agent).status_code == 422
    assert client.put("/api/v1/agents/bad%20region", json=good, headers=agent).status_code == 422
    for version in (-1, 2**31, 2**70):  # beyond the snapshot counter: refused by the contract, on both databases
        assert client.put("/api/v1/agents/eu", json={**good, "snapshot_version": version},
                          headers=agent).status_code == 422, version
    for role in ("viewer", "operator", "gateway"):
        assert client.put("/api/v1/agents/eu", json=good, headers=as_role(role)).status_code == 403, role
    assert client.get("/api/v1/agents", headers=agent).status_code == 403  # machines read only what they need
    [kept] = client.get("/api/v1/agents", headers=as_role("viewer")).json()
    assert (kept["sent_at"], kept["agent_id"]) == (good["sent_at"], good["agent_id"])


def test_an_agent_token_reads_what_the_agent_needs_and_ships_only_agent_events(
    client: TestClient, as_role: Any, agent_token: str, clock: ManualClock
) -> None:
    agent = bearer(agent_token)
    assert client.get("/api/v1/gateways", params={"region": "eu"}, headers=agent).status_code == 200
    assert client.get("/api/v1/snapshot", headers=agent).status_code == 200

    def batch(actor: str) -> dict[str, Any]:
        return EventBatch(events=[DataPlaneEvent(kind="probe.verdict", actor=actor, region="eu", instance_id="e1",
                                                 reason="ok → wrong_output", at=clock.utcnow())]).model_dump(mode="json")

    assert client.post("/api/v1/events/dataplane", json=batch("agent:eu"), headers=agent).status_code == 202
    refused = client.post("/api/v1/events/dataplane", json=batch("gateway:gw-1"), headers=agent)
    assert (refused.status_code, refused.json()["error"]["param"]) == (422, "actor")
    assert client.post("/api/v1/events/dataplane", json=batch("agent:eu"), headers=as_role("gateway")).status_code == 422
    assert client.put("/api/v1/gateways/gw-1", json={}, headers=agent).status_code == 403
    for path in ("/api/v1/events", "/api/v1/catalog/versions", "/api/v1/regions"):
        assert client.get(path, headers=agent).status_code == 403, path
    kinds = [e["kind"] for e in client.get("/api/v1/events", headers=as_role("viewer")).json()]
    assert kinds.count("probe.verdict") == 1


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_agent_reports_migration_goes_down_and_up(backend: str, tmp_path: Path) -> None:
    from sqlalchemy import inspect

    from controlplane.db import build_engine
    from controlplane.schema import downgrade, upgrade
    from tests.support.controlplane_testing import throwaway_database

    with throwaway_database(backend, tmp_path) as url:
        upgrade(url, "0010")
        engine = build_engine(url)
        try:
            with engine.connect() as conn:
                columns = {c["name"] for c in inspect(conn).get_columns("agent_reports")}
            assert columns == {"region", "agent_id", "snapshot_version", "instances", "sent_at", "received_at",
                               "reported_by"}
            downgrade(url, "0009")
            with engine.connect() as conn:
                assert "agent_reports" not in inspect(conn).get_table_names()
            upgrade(url, "0010")
            with engine.connect() as conn:
                assert "agent_reports" in inspect(conn).get_table_names()
            upgrade(url, "0014")
            with engine.connect() as conn:
                assert "snapshot_epoch" in {c["name"] for c in inspect(conn).get_columns("agent_reports")}
            downgrade(url, "0013")
            with engine.connect() as conn:
                assert "snapshot_epoch" not in {c["name"] for c in inspect(conn).get_columns("agent_reports")}
        finally:
            engine.dispose()
