"""A cold-tier pool's staged artifacts, checked by a real agent tick against the real snapshot; both databases.

The catalog registers a version (its files hashed, `POST /api/v1/catalog/...`),
the alias is promoted, the agent polls `GET /api/v1/snapshot` with its own
client (`contract.snapshot_client`, httpx to the control plane's ASGI app),
checks the pool's staged copy in its tick, reports it (`PUT /api/v1/agents/r1`,
read back through `GET /api/v1/agents`) and ships the outcome's change as a
`pool.staging` event (`GET /api/v1/events`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
from fastapi.testclient import TestClient

from common.clock import ManualClock
from contract.snapshot_client import SnapshotClient
from tests.integration.warm_pool.test_agent_reports import agent_token  # noqa: F401 (a fixture)
from tests.support.controlplane_testing import write_artifact
from tests.unit.warm_pool.test_pool_agent import Fleet, make_agent, settle
from tests.unit.warm_pool.test_pool_staging import PLAN_INPUTS
from warm_pool.events import EventShipper
from warm_pool.report import ReportSender


async def test_a_cold_pool_reports_its_staged_version_verified_then_the_corrupted_shard(
    client: TestClient, as_role: Any, agent_token: str, clock: ManualClock, tmp_path: Path  # noqa: F811
) -> None:
    catalog_copy = write_artifact(tmp_path / "catalog" / "v1", shards=2)
    op = as_role("operator")
    assert client.post("/api/v1/catalog/models/m/versions", json={"version": "v1", "location": str(catalog_copy)},
                       headers=op).status_code == 201
    assert client.post("/api/v1/catalog/models/m/aliases/prod/promote", json={"version": "v1"},
                       headers=op).status_code == 200
    staged = Path(shutil.copytree(catalog_copy, tmp_path / "region" / "v1"))  # what the region's driver loads

    agent, _, _ = make_agent(Fleet(), clock, agent_id="agent-r1", pool={
        "model": "m", "versions": {"v1": str(staged)}, "state_dir": str(tmp_path / "state"),
        "staging_check_every": 60, "plan": {**PLAN_INPUTS, "tier": "cold"}})
    viewer = as_role("viewer")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=client.app), base_url="http://cp") as http:
        agent.snapshots = SnapshotClient(http, "http://cp", token=agent_token)
        agent.reporter = ReportSender(http, "http://cp", token=agent_token)
        agent.shipper = EventShipper(http, "http://cp", token=agent_token)

        async def tick_and_report() -> dict[str, Any]:
            await agent.snapshots.poll()
            await settle(agent, clock)
            await agent.staging.wait()
            assert await agent.send_report() == "sent"
            await agent.shipper.flush()
            [shown] = client.get("/api/v1/agents", params={"region": "r1"}, headers=viewer).json()
            return shown

        shown = await tick_and_report()
        [version] = shown["staging"]
        assert (version["model"], version["version"], version["outcome"], version["directory"]) == (
            "m", "v1", "verified", str(staged))

        shard = staged / "model-00002-of-00002.safetensors"
        shard.write_bytes(shard.read_bytes()[:-1] + b"\x00")  # one byte gone bad on the region's disk
        clock.advance(60)
        [version] = (await tick_and_report())["staging"]
        assert (version["outcome"], version["shard"]) == ("mismatch", shard.name)

    events = client.get("/api/v1/events", params={"kind": "pool.staging"}, headers=viewer).json()
    assert [(e["after"]["outcome"], e["after"]["shard"]) for e in sorted(events, key=lambda e: e["id"])] == [
        ("verified", None), ("mismatch", shard.name)]
    assert agent.metrics.registry.get_sample_value("lifeline_agent_staged_version_verified", {"version": "v1"}) == 0


async def test_a_loss_never_starts_the_bad_copy_the_control_plane_shows_why_and_the_fixed_copy_starts(
    client: TestClient, as_role: Any, agent_token: str, clock: ManualClock, tmp_path: Path  # noqa: F811
) -> None:
    catalog_copy = write_artifact(tmp_path / "catalog" / "v1", shards=2)
    op = as_role("operator")
    assert client.post("/api/v1/catalog/models/m/versions", json={"version": "v1", "location": str(catalog_copy)},
                       headers=op).status_code == 201
    assert client.post("/api/v1/catalog/models/m/aliases/prod/promote", json={"version": "v1"},
                       headers=op).status_code == 200
    staged = Path(shutil.copytree(catalog_copy, tmp_path / "region" / "v1"))
    shard = staged / "model-00001-of-00002.safetensors"
    good = shard.read_bytes()

    fleet = Fleet()
    agent, _, _ = make_agent(fleet, clock, agent_id="agent-r1", pool={
        "model": "m", "versions": {"v1": str(staged)}, "state_dir": str(tmp_path / "state"),
        "staging_check_every": 60, "plan": {**PLAN_INPUTS, "tier": "cold"}})
    viewer = as_role("viewer")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=client.app), base_url="http://cp") as http:
        agent.snapshots = SnapshotClient(http, "http://cp", token=agent_token)
        agent.reporter = ReportSender(http, "http://cp", token=agent_token)
        agent.shipper = EventShipper(http, "http://cp", token=agent_token)
        await agent.snapshots.poll()
        fleet.weights_digest = agent.snapshot.models["m"].versions["v1"].weights_digest  # engines of the catalog's weights

        async def ticks(n: int = 1) -> dict[str, Any]:
            for _ in range(n):
                await agent.snapshots.poll()
                await settle(agent, clock)
                await agent.staging.wait()
            assert await agent.send_report() == "sent"
            await agent.shipper.flush()
            [shown] = client.get("/api/v1/agents", params={"region": "r1"}, headers=viewer).json()
            return shown

        shown = await ticks(4)
        assert {i["zone"]: i["pool_state"] for i in shown["instances"]} == {"x": "serving", "y": "serving"}

        shard.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # one bit gone bad on the region's disk
        clock.advance(60)
        await ticks()
        [lost] = [i for i in agent.instances.values() if i.zone == "x"]
        fleet.engines[lost.instance_id].live = False  # the loss that needs a new instance from that copy
        started = len(agent.driver.started)
        shown = await ticks(4)
        assert len(agent.driver.started) == started
        assert [i["zone"] for i in shown["instances"]] == ["y"]
        [version] = shown["staging"]
        assert (version["outcome"], version["shard"], version["held_starts"]) == ("mismatch", shard.name, 1)

        resync = shard.with_name("resync.partial")
        resync.write_bytes(good)
        resync.replace(shard)  # the operator re-syncs the copy
        await ticks()
        shown = await ticks(3)
        [version] = shown["staging"]
        assert (version["outcome"], version["held_starts"]) == ("verified", 0)
        assert len(agent.driver.started) == started + 1 and agent.driver.started[-1].zone == "x"

    [refused] = client.get("/api/v1/events", params={"kind": "pool.start_refused"}, headers=viewer).json()
    assert (refused["after"]["version"], refused["after"]["outcome"], refused["after"]["shard"],
            refused["after"]["held"]) == ("v1", "mismatch", shard.name, 1)
    assert refused["actor"] == "agent:r1" and shard.name in refused["reason"]
    events = client.get("/api/v1/events", params={"kind": "pool.staging"}, headers=viewer).json()
    assert [e["after"]["outcome"] for e in sorted(events, key=lambda e: e["id"])] == ["verified", "mismatch", "verified"]
