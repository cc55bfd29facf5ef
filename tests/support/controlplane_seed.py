"""A fleet seeded through the control plane's API: one of everything a GET route can show.

Topology (eu: eu-a, eu-b; us: us-a; a cluster per zone serving `llama`), a
live lease and an ejection, gateway and agent reports, a data-plane event,
two catalog versions with `prod` and `canary` and a known issue, an executed
l7 cutover, a zonal shift, a mesh route, a drill and a run, a replication
policy. Used by the tests that walk every route of the OpenAPI document.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from common.clock import ManualClock
from contract.events import AgentInstance, AgentReport, DataPlaneEvent, EventBatch, GatewayReport, LiveEndpoint
from contract.lease import Lease
from controlplane.auth import service as auth_service
from controlplane.auth.roles import Role
from controlplane.db import session_scope
from controlplane.topology.lease import InMemoryLeaseReader
from tests.support.controlplane_testing import write_artifact

PATH_VALUES = {
    "region": "eu", "name": "c-eu-a", "model": "llama", "version": "v1", "alias": "prod", "session_class": "chat",
}


def seed_fleet(client: TestClient, as_role: Any, *, session_factory: Any, clock: ManualClock,
               lease_reader: InMemoryLeaseReader, tmp_path: Path) -> dict[str, Any]:
    """Seed through the API (and the lease reader); the path parameters that name what was made."""
    op, gateway = as_role("operator"), as_role("gateway")
    with session_scope(session_factory) as session:
        _, agent_secret = auth_service.create_token(session, name="test-agent", role=Role.AGENT, created_by="test",
                                                    clock=clock)
    agent = {"Authorization": f"Bearer {agent_secret}"}

    def ok(response: Any) -> Any:
        assert response.status_code < 300, (response.request.method, response.request.url, response.text)
        return response.json() if response.content else None

    for region, zones in (("eu", ("eu-a", "eu-b")), ("us", ("us-a",))):
        ok(client.post("/api/v1/regions", json={"name": region}, headers=op))
        for zone in zones:
            ok(client.post(f"/api/v1/regions/{region}/zones", json={"name": zone}, headers=op))
            ok(client.post("/api/v1/clusters", json={"name": f"c-{zone}", "region": region, "zone": zone,
                                                     "model": "llama", "weight": 100}, headers=op))
    lease_reader.put(Lease(instance_id="e1", generation=3, url="http://127.0.0.1:1", version="v1", zone="eu-a",
                           region="eu", expires_at=clock.wall() + 60))
    ok(client.post("/api/v1/regions/eu/ejections", json={"instance_id": "e1", "generation": 2, "reason": "old"},
                   headers=op))
    now = clock.utcnow()
    ok(client.put("/api/v1/agents/eu", headers=agent, json=AgentReport(
        region="eu", agent_id="agent-eu", sent_at=now, snapshot_version=1, instances=[AgentInstance(
            instance_id="e1", zone="eu-a", version="v1", url="http://127.0.0.1:1", origin="registry",
            verdict="ok", verdict_since=now, lease_generation=3)],
    ).model_dump(mode="json")))
    ok(client.post("/api/v1/events/dataplane", headers=gateway, json=EventBatch(events=[DataPlaneEvent(
        kind="instance.suppressed", actor="gateway:gw-1", region="eu", instance_id="e1", generation=3,
        reason="connect refused", at=datetime(2025, 12, 31, 23, 59, tzinfo=UTC), detail={})]).model_dump(mode="json")))

    for index, version in enumerate(("v1", "v2"), start=1):
        root = write_artifact(tmp_path / version, seed=index)
        ok(client.post("/api/v1/catalog/models/llama/versions", json={"version": version, "location": str(root)},
                       headers=op))
        ok(client.post("/api/v1/catalog/models/llama/aliases/prod/promote", json={"version": version}, headers=op))
    ok(client.post("/api/v1/catalog/models/llama/aliases/canary/promote", json={"version": "v1"}, headers=op))
    ok(client.post("/api/v1/catalog/models/llama/versions/v1/issues", json={"severity": "low", "title": "slow"},
                   headers=op))

    cutover = ok(client.post("/api/v1/cutovers", headers=op, json={
        "scope": {"kind": "zone", "region": "eu", "name": "eu-b"}, "tier": "l7", "target_state": "out",
        "reason": "walk"}))
    ok(client.post(f"/api/v1/cutovers/{cutover['id']}/execute", json={"idempotency_key": "walk"}, headers=op))
    # after the cutover: a gateway that reports makes the l7 tier wait for it to apply the cutover's snapshot
    ok(client.put("/api/v1/gateways/gw-1", headers=gateway, json=GatewayReport(
        replica_id="gw-1", region="eu", zone="eu-a", snapshot_version=1, snapshot_applied_at=now,
        routing_source="snapshot", reported_at=now, suppressed=0,
        live_endpoints=[LiveEndpoint(instance_id="e1", generation=3, version="v1", zone="eu-a")],
    ).model_dump(mode="json")))
    shift = ok(client.post("/api/v1/zonal-shifts", headers=op, json={
        "region": "us", "zone": "us-a", "expires_in": "PT1H", "reason": "walk"}))
    ok(client.put("/api/v1/mesh-routes", headers=op, json={
        "model": "llama", "reason": "walk", "destinations": [{"version": "v1", "zone": "eu-a", "weight": 99},
                                                              {"version": "v2", "zone": "eu-a", "weight": 1}]}))
    ok(client.post("/api/v1/drills", headers=op, json={
        "name": "kill-one", "model": "llama", "scope": "instance", "fault": "sigkill",
        "blast_radius": {"region": "eu", "instances": ["e1"]}}))
    run = ok(client.post("/api/v1/drills/kill-one/runs", headers=op))
    ok(client.put("/api/v1/replication/policies", headers=op, json={
        "model": "llama", "session_class": "chat", "mode": "critical", "rpo_context_seconds": 30,
        "source_store": f"file://{tmp_path}/kv-primary", "destination_store": f"file://{tmp_path}/kv-standby",
        "retention_seconds": 3600, "reason": "walk"}))
    return {**PATH_VALUES, "cutover_id": cutover["id"], "shift_id": shift["id"], "run_id": run["id"]}
