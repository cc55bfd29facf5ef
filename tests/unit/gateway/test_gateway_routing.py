"""Endpoint choice: ejection per generation, bounded-load hashing, admission limits."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest

from gateway.admission import Admission
from common.clock import ManualClock
from gateway.errors import NoHealthyEndpoint, Overloaded
from contract.lease import Registration
from gateway.lease_registry import InMemoryLeaseRegistry
from gateway.router import LeaseView, Router
from gateway.routing_table import StaticRoutingTable
from gateway.settings import GatewaySettings


async def _router(n: int, **admission) -> tuple[Router, InMemoryLeaseRegistry, ManualClock]:
    clock = ManualClock()
    settings = GatewaySettings(models=[{"alias": "m", "version": "v", "model_dir": Path("/nonexistent")}],
                               admission={"max_concurrency_per_engine": 4, "max_queue": 0, **admission})
    registry = InMemoryLeaseRegistry(timedelta(seconds=2), clock)
    for i in range(n):
        await registry.register(Registration(f"e{i}", f"http://e{i}", "v"))
    view = LeaseView(registry, refresh_interval=1.0, cached=False)
    router = Router(settings, StaticRoutingTable(settings.models), view, Admission(settings.admission), clock)
    return router, registry, clock


async def test_suppression_is_per_generation_and_expires():
    router, registry, clock = await _router(2)
    e0 = next(e for e in await router.endpoints("v") if e.instance_id == "e0")
    await router.failed(e0, "connect")
    assert [e.instance_id for e in await router.endpoints("v")] == ["e1"]
    await registry.register(Registration("e0", "http://e0", "v"))  # restart: new generation
    assert {e.instance_id for e in await router.endpoints("v")} == {"e0", "e1"}
    await router.failed(next(e for e in await router.endpoints("v") if e.instance_id == "e0"), "connect")
    for _ in range(6):  # the engines keep renewing while the suppression runs out
        clock.advance(1.7)
        for lease in await registry.live():
            await registry.renew(lease.instance_id, lease.generation)
    assert {e.instance_id for e in await router.endpoints("v")} == {"e0", "e1"}


async def test_least_outstanding_and_refusal_when_full():
    router, _, _ = await _router(2, max_concurrency_per_engine=1)
    a = await router.acquire("v", client_key=None, queue_timeout=0)
    b = await router.acquire("v", client_key=None, queue_timeout=0)
    assert {a.instance_id, b.instance_id} == {"e0", "e1"}
    with pytest.raises(Overloaded) as refused:
        await router.acquire("v", client_key=None, queue_timeout=0)
    assert refused.value.headers()["Retry-After"] == "1"
    await router.release(a)
    assert (await router.acquire("v", client_key=None, queue_timeout=0)).instance_id == a.instance_id


async def test_no_endpoint_is_a_503_not_a_hang():
    router, _, clock = await _router(1)
    await router.failed((await router.endpoints("v"))[0], "connect")
    with pytest.raises(NoHealthyEndpoint):
        await router.acquire("v", client_key=None, queue_timeout=5)


async def test_client_affinity_is_sticky_until_the_load_bound():
    router, _, _ = await _router(4, max_concurrency_per_engine=100, hash_load_factor=1.25)
    first = await router.acquire("v", client_key="user-7", queue_timeout=0)
    await router.release(first)
    assert (await router.acquire("v", client_key="user-7", queue_timeout=0)).instance_id == first.instance_id
    # A hot key spills over instead of pinning one engine: load stays within c × mean.
    picks = Counter(e.instance_id for e in [await router.acquire("v", client_key="user-7", queue_timeout=0) for _ in range(39)])
    assert picks[first.instance_id] <= 1.25 * 40 / 4 + 1
    assert len(picks) > 1


async def test_an_engine_joining_or_leaving_moves_only_the_clients_it_is_first_for():
    router, registry, _ = await _router(8, max_concurrency_per_engine=100)
    clients = [f"user-{n}" for n in range(200)]

    async def placement() -> dict[str, str]:
        picks = {}
        for client in clients:
            picks[client] = (await router.acquire("v", client_key=client, queue_timeout=0)).instance_id
            await router.release(await _endpoint(router, picks[client]))
        return picks

    before = await placement()
    joined = await registry.register(Registration("e8", "http://e8", "v"))
    after = await placement()
    assert {c for c in clients if after[c] != before[c]} == {c for c in clients if after[c] == "e8"}
    assert 0 < sum(1 for c in clients if after[c] == "e8") < len(clients) / 4
    await registry.release(joined.instance_id, joined.generation)
    assert await placement() == before


async def _endpoint(router: Router, instance_id: str):
    return next(e for e in await router.endpoints("v") if e.instance_id == instance_id)


async def test_each_local_ejection_is_told_to_the_event_listener_once():
    router, _, _ = await _router(2)
    told = []

    router.on_ejected = lambda endpoint, reason: told.append((endpoint.instance_id, reason))
    e0 = next(e for e in await router.endpoints("v") if e.instance_id == "e0")
    assert await router.failed(e0, "connect")
    assert await router.failed(e0, "connect")  # already out: not told twice
    assert not await router.failed(next(e for e in await router.endpoints("v")), "http_500")  # 1 of 3 in a row
    assert told == [("e0", "connect")]


async def test_endpoints_that_failed_a_request_are_taken_only_as_a_last_resort_the_latest_last():
    router, _, _ = await _router(2)
    e0, e1 = sorted(await router.endpoints("v"), key=lambda e: e.instance_id)
    for _ in range(10):  # avoided: taken only when nothing else is left
        chosen = await router.acquire("v", client_key=None, queue_timeout=0, avoid=(e0.key,))
        assert chosen == e1
        await router.release(chosen)
    assert (await router.acquire("v", client_key="c", queue_timeout=0, prefer="e0", avoid=(e0.key,))) == e1
    for _ in range(10):  # both failed it: the earlier failure first, the one that just failed last
        chosen = await router.acquire("v", client_key=None, queue_timeout=0, avoid=(e1.key, e0.key))
        assert chosen == e1
        await router.release(chosen)
    assert await router.failed(e0, "connect") and await router.failed(e1, "connect")
    with pytest.raises(NoHealthyEndpoint) as refused:  # both ejected: nothing to wait for
        await router.acquire("v", client_key=None, queue_timeout=3600, avoid=(e0.key, e1.key))
    assert refused.value.error_type == "no_healthy_endpoint" and "e0@" in refused.value.message


async def test_engines_without_token_ids_are_ejected_past_the_cap_and_refused_engine_incompatible():
    from gateway.errors import EngineIncompatible

    router, _, _ = await _router(2)
    e0, e1 = sorted(await router.endpoints("v"), key=lambda e: e.instance_id)
    assert await router.failed(e0, "no_token_ids")  # at once, not after consecutive_5xx
    assert await router.left_routing(e0) == "ejected locally after failures"
    assert await router.failed(e1, "no_token_ids")  # even the last one: it cannot serve any stream
    with pytest.raises(EngineIncompatible) as refused:
        await router.acquire("v", client_key=None, queue_timeout=0)
    assert (refused.value.status_code, refused.value.error_type) == (502, "engine_incompatible")
    assert "e0, e1" in refused.value.message and "return_token_ids" in refused.value.message


async def test_an_endpoint_leaves_routing_with_its_lease():
    router, registry, _ = await _router(1)
    (e0,) = await router.endpoints("v")
    assert await router.left_routing(e0) is None
    await registry.release(e0.instance_id, e0.generation)
    assert await router.left_routing(e0) == "its lease was released or lapsed"
