"""One contract, one test crossing both sides: a replication policy written through the control plane's API
reaches a gateway's session policy through the gateway's own snapshot poller, on SQLite and PostgreSQL.

The poller talks to the real control-plane app (httpx's ASGI transport, a `gateway`-role token); what it
applies is what `SessionKeeper` checkpoints by. Store URLs stay in the control plane: the snapshot carries
when to checkpoint and the declared RPO_context, never a store's credentials.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from fastapi.testclient import TestClient

from common.clock import ManualClock
from gateway.artifacts import ArtifactLoader
from gateway.l7_events import EventShipper
from gateway.metrics import GatewayMetrics
from gateway.routing_table import ModelVersion
from gateway.sessions import SessionKeeper
from gateway.settings import SessionsConfig
from gateway.snapshot_source import PollOutcome, SnapshotSource
from gateway.snapshot_table import SnapshotRouting

SECRET = "redis://:hunter2@127.0.0.1:6379/0?key_prefix=standby:"


def policy(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "session_class": "chat", "mode": "critical", "rpo_context_seconds": 30,
            "rpo_context_turns": 0, "source_store": "file:///var/kv/primary", "destination_store": SECRET,
            "retention_seconds": 3600, "reason": "standby for chat", **fields}


async def test_a_policy_set_through_the_api_is_what_the_gateways_poller_checkpoints_by(
        client: TestClient, as_role: Any, tmp_path: Path) -> None:
    assert client.put("/api/v1/replication/policies", json=policy(), headers=as_role("operator")).status_code == 200
    assert client.put("/api/v1/replication/policies", headers=as_role("operator"), json=policy(
        session_class="batch", mode="interactive", every_turns=4, every_seconds=60,
        rpo_context_seconds=120, rpo_context_turns=3)).status_code == 200

    clock = ManualClock()
    routing = SnapshotRouting("local")
    events = EventShipper(replica_id="gw-1", region="local", clock=clock, controlplane_url="http://cp")
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=client.app), base_url="http://cp",
                             headers=as_role("gateway"))
    source = SnapshotSource(routing=routing, loader=ArtifactLoader(download_dir=tmp_path / "dl"), events=events,
                            make_event=events.event, clock=clock, controlplane_url="http://cp",
                            cache_path=tmp_path / "snapshot.json", http=http)
    assert await source.poll_once() == PollOutcome.APPLIED
    snapshot = routing.table.snapshot
    assert snapshot is not None
    assert [(p.session_class, p.mode, p.every_turns, p.every_seconds, p.rpo_context_seconds, p.rpo_context_turns,
             p.revision) for p in snapshot.replication_policies] == [
        ("batch", "interactive", 4, 60, 120, 3, 1), ("chat", "critical", None, None, 30, 0, 1)]
    assert "hunter2" not in (tmp_path / "snapshot.json").read_text()  # nor any store URL on the gateway's disk
    assert "var/kv/primary" not in (tmp_path / "snapshot.json").read_text()

    keeper = SessionKeeper(SessionsConfig(), routing, GatewayMetrics(), clock)
    version = ModelVersion("tiny", "tiny-v1", tmp_path)
    model, chat = keeper.policy_for(version, "chat")
    assert (model, chat.mode if chat else None) == ("tiny", "critical")
    assert keeper.policy_for(version, "unknown") == ("tiny", None)  # no policy: never checkpointed
    await keeper.close()
    await http.aclose()


async def test_a_policy_changed_after_the_first_poll_reaches_the_poller(
        client: TestClient, as_role: Any, tmp_path: Path) -> None:
    assert client.put("/api/v1/replication/policies", json=policy(), headers=as_role("operator")).status_code == 200
    clock = ManualClock()
    routing = SnapshotRouting("local")
    events = EventShipper(replica_id="gw-1", region="local", clock=clock, controlplane_url="http://cp")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=client.app), base_url="http://cp",
                                 headers=as_role("gateway")) as http:
        source = SnapshotSource(routing=routing, loader=ArtifactLoader(download_dir=tmp_path / "dl"), events=events,
                                make_event=events.event, clock=clock, controlplane_url="http://cp",
                                cache_path=tmp_path / "snapshot.json", http=http)
        assert await source.poll_once() == PollOutcome.APPLIED
        assert client.put("/api/v1/replication/policies", headers=as_role("operator"), json=policy(
            mode="interactive", every_turns=2, expected_revision=1)).status_code == 200
        assert await source.poll_once() == PollOutcome.APPLIED
        snapshot = routing.table.snapshot
        assert snapshot is not None and snapshot.replication_policy("tiny", "chat").mode == "interactive"
