"""The snapshot poller's accept/refuse table across control-plane epochs (contract.snapshot_client).

Versions grow within one control-plane database; a gateway or agent that was
polling database A and is now answered by B (fresh, or restored and rotated)
must take B's lower versions, and still refuse a lower version of the epoch
it holds. Driven through `SnapshotClient.poll` on an httpx.MockTransport that
honours If-None-Match as the real endpoint does, with the cache on disk.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from contract.snapshot import RoutingSnapshot, etag_for, if_none_match_hits
from contract.snapshot_client import PollOutcome, SnapshotClient, refusal

A = "0b7f2c3e-aaaa-4a4a-8a8a-000000000001"
B = "0b7f2c3e-bbbb-4b4b-8b8b-000000000002"


def snap(version: int, epoch: str | None) -> RoutingSnapshot:
    return RoutingSnapshot(version=version, controlplane_epoch=epoch)


@pytest.mark.parametrize(("held", "offered", "taken"), [
    (None, (1, A), True),                 # nothing held: anything valid
    ((5, A), (5, A), True),               # the same content again
    ((5, A), (6, A), True),               # newer, same database
    ((5, A), (4, A), False),              # older, same database: refused
    ((5, A), (0, A), False),
    ((50, A), (1, B), True),              # another database, lower version: taken
    ((1, A), (50, B), True),              # another database, higher version: taken
    ((5, A), (5, B), True),               # another database, equal version: taken (not "unchanged")
    ((50, None), (1, A), True),           # from a control plane before epochs to one with
    ((50, A), (1, None), True),           # and back: a pre-epoch control plane is an epoch of its own
    ((5, None), (4, None), False),        # two pre-epoch snapshots: one epoch, compared as before
])
def test_refusal_compares_versions_only_within_an_epoch(held, offered, taken):
    why = refusal(snap(*held) if held else None, snap(*offered))
    assert (why is None) is taken
    if not taken:
        assert "older" in why and str(offered[0]) in why


def test_etag_carries_the_epoch_so_equal_versions_of_two_databases_never_match():
    a, b = snap(7, A).etag, snap(7, B).etag
    assert a != b and A in a and B in b
    assert not if_none_match_hits(a, b) and if_none_match_hits(f"W/{a}", a)
    assert snap(7, None).etag == etag_for(7) == '"snapshot-7"'  # unchanged for a pre-epoch control plane


@pytest.mark.parametrize("epoch", ["", "a b", 'x"y', "a,b", "x" * 65, "-leading"])
def test_an_epoch_that_cannot_sit_in_an_etag_is_invalid(epoch):
    with pytest.raises(ValueError):
        RoutingSnapshot(version=1, controlplane_epoch=epoch)


class Database:
    """One control-plane database as the snapshot endpoint serves it: epoch, version, If-None-Match."""

    def __init__(self, epoch: str, version: int) -> None:
        self.epoch, self.version = epoch, version

    def answer(self, request: httpx.Request) -> httpx.Response:
        body = snap(self.version, self.epoch)
        if if_none_match_hits(request.headers.get("if-none-match"), body.etag):
            return httpx.Response(304, headers={"ETag": body.etag})
        return httpx.Response(200, content=body.model_dump_json(), headers={"ETag": body.etag})


async def test_a_consumer_moved_to_another_database_takes_its_lower_versions_and_replaces_the_cache(tmp_path: Path):
    a, b = Database(A, 40), Database(B, 3)
    serving = [a]
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("if-none-match"))
        return serving[0].answer(request)

    cache = tmp_path / "snapshot.json"
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        client = SnapshotClient(http, "http://cp", cache_path=cache)
        assert await client.poll() == PollOutcome.APPLIED
        assert await client.poll() == PollOutcome.UNCHANGED
        serving[0] = b  # the address now answers from another database, with lower versions
        assert await client.poll() == PollOutcome.APPLIED
        assert (client.current.version, client.current.controlplane_epoch) == (3, B)
        assert json.loads(cache.read_text())["controlplane_epoch"] == B
        assert await client.poll() == PollOutcome.UNCHANGED
        b.version = 4
        assert await client.poll() == PollOutcome.APPLIED
        # Within B, an older version is still refused and the held one (and its disk copy) stays.
        b.version = 2
        assert await client.poll() == PollOutcome.REFUSED
        assert client.current.version == 4 and "older" in (client.last_refusal or "")
        assert json.loads(cache.read_text())["version"] == 4
    assert seen[:4] == [None, etag_for(40, A), etag_for(40, A), etag_for(3, B)]

    restarted = SnapshotClient(httpx.AsyncClient(), "http://cp", cache_path=cache)
    held = restarted.load_cache()
    assert held is not None and (held.version, held.controlplane_epoch) == (4, B)


async def test_a_restart_on_a_cache_from_another_database_takes_the_new_one(tmp_path: Path):
    cache = tmp_path / "snapshot.json"
    cache.write_text(snap(99, A).model_dump_json())
    b = Database(B, 1)
    async with httpx.AsyncClient(transport=httpx.MockTransport(b.answer)) as http:
        client = SnapshotClient(http, "http://cp", cache_path=cache)
        assert client.load_cache() is not None and client.current.version == 99
        assert await client.poll() == PollOutcome.APPLIED
    assert json.loads(cache.read_text())["controlplane_epoch"] == B
