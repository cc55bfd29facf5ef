"""Events reach the control plane in batches and survive its absence; the snapshot client keeps the last good one."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from contract.events import DataPlaneEvent, EventBatch
from contract.snapshot_client import PollOutcome, SnapshotClient
from warm_pool.events import EventShipper


def event(n: int) -> DataPlaneEvent:
    return DataPlaneEvent(kind="probe.verdict", actor="agent:r1", region="r1", instance_id=f"e{n}", reason="x",
                          at=datetime(2026, 1, 1, tzinfo=UTC))


async def test_events_wait_for_the_control_plane_and_count_what_was_dropped() -> None:
    up = False
    received: list[EventBatch] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if not up:
            raise httpx.ConnectError("down")
        assert request.url.path == "/api/v1/events/dataplane"
        assert request.headers["authorization"] == "Bearer t"
        received.append(EventBatch.model_validate_json(request.content))
        return httpx.Response(202, json={"accepted": len(received[-1].events)})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        shipper = EventShipper(http, "http://cp", token="t", capacity=3)
        for n in range(5):
            shipper.emit(event(n))
        assert await shipper.flush() == 0
        up = True
        assert await shipper.flush() == 3
    assert [e.instance_id for e in received[0].events] == ["e2", "e3", "e4"]
    assert received[0].dropped == 2
    assert not shipper.buffer and shipper.dropped == 0


SNAPSHOT = {"version": 3, "models": {}}


async def test_snapshot_client_keeps_the_last_good_one_on_disk(tmp_path: Path) -> None:
    answers: list[httpx.Response | Exception] = [
        httpx.Response(200, json=SNAPSHOT, headers={"ETag": '"snapshot-3"'}),
        httpx.Response(304),
        httpx.Response(200, json={"version": "not a number"}),
        httpx.Response(200, json={"version": 2, "models": {}}),
        httpx.ConnectError("down"),
    ]
    seen_etags = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen_etags.append(request.headers.get("if-none-match"))
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    cache = tmp_path / "snapshot.json"
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        client = SnapshotClient(http, "http://cp", cache_path=cache)
        outcomes = [await client.poll() for _ in range(5)]
    assert outcomes == [PollOutcome.APPLIED, PollOutcome.UNCHANGED, PollOutcome.REFUSED, PollOutcome.REFUSED,
                        PollOutcome.UNREACHABLE]
    assert seen_etags == [None] + ['"snapshot-3"'] * 4
    assert client.current is not None and client.current.version == 3
    restarted = SnapshotClient(httpx.AsyncClient(), "http://cp", cache_path=cache)
    assert restarted.load_cache() is not None and restarted.current.version == 3
    assert json.loads(cache.read_text())["version"] == 3


def report(replica: str, region: str, served: dict[str, str | None], *, stale: bool = False) -> dict:
    return {"replica_id": replica, "region": region, "zone": "z1", "routing_source": "snapshot",
            "reported_at": "2026-01-01T00:00:00Z", "stale": stale, "age_s": 1.0,
            "live_endpoints": [{"instance_id": i, "generation": 1, "version": "v1", "zone": "z1", "served_ok_at": at}
                               for i, at in served.items()]}


@pytest.mark.parametrize("wrapped", [False, True])
async def test_served_recently_takes_the_newest_success_of_fresh_reports(wrapped: bool) -> None:
    from warm_pool.served import served_recently

    rows = [report("gw-a", "r1", {"e1": "2026-01-01T00:00:05Z", "e2": None}),
            report("gw-b", "r1", {"e1": "2026-01-01T00:00:09Z"}),
            report("gw-c", "r1", {"e3": "2026-01-01T00:00:09Z"}, stale=True),
            report("gw-d", "r2", {"e4": "2026-01-01T00:00:09Z"})]

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.params["region"] == "r1"
        return httpx.Response(200, json={"gateways": rows} if wrapped else rows)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        served = await served_recently(http, "http://cp", region="r1")
    assert served == {"e1": datetime(2026, 1, 1, 0, 0, 9, tzinfo=UTC)}
