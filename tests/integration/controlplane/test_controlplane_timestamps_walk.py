"""Every timestamp the API writes carries a UTC offset: a walk over the OpenAPI document's GET routes.

Not a check per field: the fleet is seeded through the API (topology,
leases, an ejection, gateway and agent reports, data-plane events, two
catalog versions with aliases and an issue, an executed cutover, a zonal
shift, a mesh route, drills and a run, a replication policy), then every
GET operation the published document lists is called, with path
parameters filled from the seed, and every string in every answer that
reads as an ISO-8601 date-time must end in `Z` or `±HH:MM`. A route added
later is walked without anyone listing it; one the seed cannot fill fails
the walk until it is named in `NOT_SEEDED` with the reason.

SQLite is the database that stores datetimes as naive text, so the walk is
about it; it runs on PostgreSQL too, where it costs little.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from common.clock import ManualClock
from contract.events import AgentInstance, AgentReport, DataPlaneEvent, EventBatch, GatewayReport, LiveEndpoint
from contract.lease import Lease
from controlplane.auth import service as auth_service
from controlplane.auth.roles import Role
from controlplane.db import session_scope
from controlplane.topology.lease import InMemoryLeaseReader
from tests.support.controlplane_testing import write_artifact

pytestmark = pytest.mark.integration

# "2026-01-01T00:00:00", with a date-time separator and at least minutes: what an ISO-8601 date-time starts with.
DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?")
WITH_OFFSET = re.compile(r"(Z|[+-]\d{2}:\d{2})$")
PATH_VALUES = {
    "region": "eu", "name": "c-eu-a", "model": "llama", "version": "v1", "alias": "prod", "session_class": "chat",
}
PER_ROUTE = {"/api/v1/drills/{name}": {"name": "kill-one"}}  # where one parameter name means two things
QUERY = {"/api/v1/pool/plan": {  # required query parameters
    "region": "eu", "zones": "eu-a,eu-b", "demand_seqs": 200, "demand_tokens_per_s": 5000, "context_tokens": 1000,
    "instance_seqs": 32, "instance_tokens_per_s": 800, "instance_prefill_tokens_per_s": 4000, "headroom": 1.2,
    "recovery_target_s": 10, "tier": "warm", "previous_version_share": 0.25}}
# GET operations whose answers hold no row the seed can make; each says why.
NOT_SEEDED = {
    "/api/v1/replication/dead-letters": "a dead letter needs a checkpoint copy that failed its retries "
                                        "(tests/integration/replication/test_replication_dead_letters.py)",
}


def offsetless(value: Any, where: str = "$") -> list[str]:
    """Every string under `value` that reads as a date-time and has no UTC offset, with its JSON path."""
    if isinstance(value, dict):
        return [bad for key, item in value.items() for bad in offsetless(item, f"{where}.{key}")]
    if isinstance(value, list):
        return [bad for index, item in enumerate(value) for bad in offsetless(item, f"{where}[{index}]")]
    if isinstance(value, str):
        if DATE_TIME.fullmatch(value.rstrip("Z")) or (DATE_TIME.match(value) and len(value) <= 40):
            if not WITH_OFFSET.search(value):
                return [f"{where} = {value!r}"]
    return []


def answer_body(response: Any) -> Any:
    kind = response.headers.get("content-type", "")
    if "json" in kind and "ndjson" not in kind:
        return response.json()
    lines = [line for line in response.text.splitlines() if line.strip()]
    try:
        return [json.loads(line) for line in lines]
    except ValueError:
        return [found.group(0) for found in re.finditer(r"\S*" + DATE_TIME.pattern + r"\S*", response.text)]


@pytest.fixture
def seeded(client: TestClient, as_role: Any, tokens: dict[str, str], session_factory: Any, clock: ManualClock,
           lease_reader: InMemoryLeaseReader, tmp_path: Path) -> dict[str, Any]:
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


def test_every_get_route_answers_timestamps_with_a_utc_offset(
    client: TestClient, as_role: Any, seeded: dict[str, Any]
) -> None:
    admin = as_role("admin")
    paths = client.get("/openapi.json").json()["paths"]
    walked, empty, offenders = [], [], []
    for template, operations in sorted(paths.items()):
        if "get" not in operations or not template.startswith("/api/"):
            continue
        values = {**seeded, **PER_ROUTE.get(template, {})}
        url = re.sub(r"{(\w+)}", lambda m: str(values[m.group(1)]), template)
        response = client.get(url, params=QUERY.get(template), headers=admin)
        assert response.status_code == 200, (template, response.status_code, response.text[:300])
        body = answer_body(response)
        walked.append(template)
        if body in ([], {}, None) and template not in NOT_SEEDED:
            empty.append(template)
        offenders += [f"GET {url}: {bad}" for bad in offsetless(body)]
    assert offenders == [], "\n".join(offenders)
    assert empty == [], "the seed leaves these answers empty, so their timestamps went unchecked"
    assert len(walked) >= 30  # the document lists the routes; a walk that found few read the wrong one


@pytest.mark.parametrize("value", ["2026-01-01T00:00:00", "2026-01-01 00:00:00.5", "2026-01-01T00:00"])
def test_the_walk_finds_a_naive_timestamp(value: str) -> None:
    assert offsetless({"rows": [{"at": value}]}) == [f"$.rows[0].at = {value!r}"]


@pytest.mark.parametrize("value", ["2026-01-01T00:00:00Z", "2026-01-01T02:00:00+02:00", "2026-01-01", "v1", "eu-a"])
def test_the_walk_passes_aware_timestamps_and_other_strings(value: str) -> None:
    assert offsetless([value]) == []
