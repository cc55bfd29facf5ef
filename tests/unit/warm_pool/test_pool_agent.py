"""The agent's decisions on virtual time: scripted engines (httpx.MockTransport), an in-memory registry, a fake driver."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import httpx

from common.clock import ManualClock
from contract.canary import CanaryRecord
from contract.events import AgentReport
from contract.lease import Lease, LeaseExpired, Registration, StaleGeneration
from contract.snapshot import RoutingSnapshot
from warm_pool.agent import Agent
from warm_pool.budget import ProbeBudget
from warm_pool.driver import PoolInstance
from warm_pool.events import EventShipper
from warm_pool.probe import Verdict
from warm_pool.settings import AgentSettings
from warm_pool.states import InstanceState

RECORD = CanaryRecord(prompt_token_ids=[1, 2], output_token_ids=[5, 6, 7], max_ttft_s=5.0)


class MemoryRegistry:
    """The LeaseRegistry protocol on a ManualClock: expiry computed at read."""

    def __init__(self, clock: ManualClock, ttl: float = 2.0) -> None:
        self.clock, self.ttl = clock, timedelta(seconds=ttl)
        self.leases: dict[str, Lease] = {}
        self.generations: dict[str, int] = {}

    async def register(self, registration: Registration) -> Lease:
        gen = self.generations[registration.instance_id] = self.generations.get(registration.instance_id, 0) + 1
        lease = Lease(registration.instance_id, gen, registration.url, registration.version, registration.zone,
                      registration.region, self.clock.wall() + self.ttl.total_seconds())
        self.leases[registration.instance_id] = lease
        return lease

    async def renew(self, instance_id: str, generation: int) -> Lease:
        if generation < self.generations.get(instance_id, 0):
            raise StaleGeneration(instance_id)
        lease = self.leases.get(instance_id)
        if lease is None or not lease.is_live(self.clock.wall()) or lease.generation != generation:
            raise LeaseExpired(instance_id)
        self.leases[instance_id] = replace(lease, expires_at=self.clock.wall() + self.ttl.total_seconds())
        return self.leases[instance_id]

    async def release(self, instance_id: str, generation: int) -> None:
        if instance_id in self.leases and self.leases[instance_id].generation == generation:
            del self.leases[instance_id]

    async def live(self) -> list[Lease]:
        return [lease for lease in self.leases.values() if lease.is_live(self.clock.wall())]

    async def close(self) -> None:
        pass


class ScriptedEngine:
    """One engine's answers; flip `output`, `live` to change them."""

    def __init__(self, instance_id: str, zone: str = "z1", version: str = "v1") -> None:
        self.instance_id, self.zone, self.version = instance_id, zone, version
        self.output = [5, 6, 7]
        self.live = True
        self.canaries = 0
        self.boot_generation, self.started_at = 1, 0.0
        self.own_lease = False  # True: started with --registry, sends X-Lifeline-Generation
        self.weights_digest = "sha256:x"  # what /healthz/generation reports
        self.running, self.waiting = 0, 0  # requests in flight, as its /metrics says (vLLM's gauges); None: 404

    def handle(self, request: httpx.Request) -> httpx.Response:
        if not self.live:
            raise httpx.ConnectError("refused")
        path = request.url.path
        if path in ("/healthz/live", "/healthz/ready"):
            return httpx.Response(200, json={"status": "ok"})
        if path == "/healthz/generation":
            return httpx.Response(200, headers={"x-lifeline-generation": "1"} if self.own_lease else {},
                                  json={"instance_id": self.instance_id, "generation": 1,
                                        "boot_generation": self.boot_generation, "model": self.version,
                                        "weights_digest": self.weights_digest, "zone": self.zone, "region": "r1",
                                        "started_at": self.started_at})
        if path == "/metrics" and self.running is not None:
            return httpx.Response(200, text=f"# TYPE vllm:num_requests_running gauge\n"
                                  f"vllm:num_requests_running {self.running}\n"
                                  f"# TYPE vllm:num_requests_waiting gauge\n"
                                  f"vllm:num_requests_waiting {self.waiting}\n")
        if path == "/v1/completions":
            self.canaries += 1
            body = "".join(f"data: {json.dumps({'choices': [{'token_ids': [t]}]})}\n\n" for t in self.output)
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body + "data: [DONE]\n\n")
        return httpx.Response(404)


class Fleet:
    def __init__(self) -> None:
        self.engines: dict[str, ScriptedEngine] = {}
        self.weights_digest = "sha256:x"  # the digest engines the driver starts report

    def transport(self) -> httpx.MockTransport:
        def handler(request: httpx.Request) -> httpx.Response:
            engine = self.engines.get(request.url.host)
            if engine is None:
                raise httpx.ConnectError("no such engine")
            return engine.handle(request)
        return httpx.MockTransport(handler)


class FakeDriver:
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.started: list[PoolInstance] = []
        self.stopped: list[str] = []

    async def start(self, *, instance_id: str, zone: str, version: str) -> PoolInstance:
        self.fleet.engines[instance_id] = engine = ScriptedEngine(instance_id, zone, version)
        engine.weights_digest = self.fleet.weights_digest
        instance = PoolInstance(instance_id, zone, version, f"http://{instance_id}")
        self.started.append(instance)
        return instance

    async def refresh(self) -> None:
        pass

    async def adopt(self) -> list[PoolInstance]:
        return []

    def alive(self, instance_id: str) -> bool:
        engine = self.fleet.engines.get(instance_id)
        return engine is not None and engine.live

    async def stop(self, instance_id: str, *, graceful: bool) -> None:
        self.stopped.append(instance_id)
        self.fleet.engines.pop(instance_id, None)

    async def close(self) -> None:
        pass


async def settle(agent: Agent, clock: ManualClock, ticks: int = 1, step: float = 0.5) -> None:
    for _ in range(ticks):
        clock.advance(step)
        await agent.tick()
        for _ in range(5):  # let background canaries finish
            await asyncio.sleep(0)
        tasks = [i.canary_task for i in agent.instances.values() if i.canary_task]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


def make_agent(fleet: Fleet, clock: ManualClock, **settings) -> tuple[Agent, MemoryRegistry, EventShipper]:
    registry = MemoryRegistry(clock)
    shipper = EventShipper(None, None)
    shipper.url = "kept"  # keep events in the buffer for the test to read
    agent_settings = AgentSettings(region="r1", **settings)
    budget = ProbeBudget(clock, per_instance_per_s=agent_settings.canary_per_instance_per_s, rng=random.Random(0))
    agent = Agent(agent_settings, registry=registry, http=httpx.AsyncClient(transport=fleet.transport()), clock=clock,
                  shipper=shipper, canary_records={"v1": RECORD}, driver=settings.get("pool") and FakeDriver(fleet),
                  budget=budget)
    return agent, registry, shipper


async def test_external_engine_gets_a_lease_after_its_canary_and_loses_it_on_wrong_output() -> None:
    clock, fleet = ManualClock(), Fleet()
    fleet.engines["e1"] = ScriptedEngine("e1")
    agent, registry, shipper = make_agent(fleet, clock, renew_leases_for="http://e1")
    await settle(agent, clock, 2)
    assert [lease.instance_id for lease in await registry.live()] == ["e1"]

    fleet.engines["e1"].output = [5, 9, 7]  # weights corrupted in memory: everything still answers 200
    for _ in range(60):
        await settle(agent, clock)
        if not await registry.live():
            break
    assert await registry.live() == []
    [event] = [e for e in shipper.buffer if e.kind == "probe.verdict" and e.detail["verdict"] == "wrong_output"]
    assert "token 1 is 9, recorded 6" in event.reason
    assert event.routing_tier == "l7" and event.actor == "agent:r1" and event.detail["changes_routing"] is True
    # never readmitted while the canary stays wrong
    await settle(agent, clock, 30)
    assert await registry.live() == []


class StockVllm(ScriptedEngine):
    """vLLM's surface: /health and the completions API, no /healthz/* and no generation header."""

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/healthz/"):
            return httpx.Response(404) if self.live else super().handle(request)
        if request.url.path == "/health":
            return httpx.Response(200) if self.live else super().handle(request)
        return super().handle(request)


async def test_engine_that_stops_answering_loses_its_lease_at_the_next_probe() -> None:
    clock, fleet = ManualClock(), Fleet()
    fleet.engines["e1"] = StockVllm("e1")
    agent, registry, shipper = make_agent(fleet, clock, renew_leases_for=[
        {"url": "http://e1", "instance_id": "e1", "version": "v1", "zone": "z1"}])
    await settle(agent, clock, 2)
    generation = (await registry.live())[0].generation
    fleet.engines["e1"].live = False
    await settle(agent, clock)
    assert await registry.live() == []
    assert [e.detail["verdict"] for e in shipper.buffer if e.kind == "probe.verdict"] == ["ok", "error"]
    fleet.engines["e1"].live = True
    await settle(agent, clock, 2)
    assert (await registry.live())[0].generation > generation  # back under a new generation


async def test_superseded_version_is_old_generation() -> None:
    clock, fleet = ManualClock(), Fleet()
    fleet.engines["e1"] = ScriptedEngine("e1", version="v1")
    agent, registry, shipper = make_agent(fleet, clock)
    await registry.register(Registration("e1", "http://e1", "v1", "z1", "r1"))  # renews its own lease

    class Snapshots:
        current = RoutingSnapshot.model_validate({"version": 4, "models": {"m": {
            "aliases": {"prod": {"version": "v2", "revision": 2}},
            "versions": {v: {"version": v, "fingerprint": "f", "location": "/x"} for v in ("v1", "v2")}}}})

    agent.snapshots = Snapshots()  # type: ignore[assignment]
    await settle(agent, clock)
    [event] = [e for e in shipper.buffer if e.kind == "probe.verdict"]
    assert event.detail["verdict"] == "old_generation" and "v2" in event.reason


async def test_a_snapshot_that_names_no_alias_checks_no_generation() -> None:
    """An empty catalog (no model yet) says no more about the wanted version than no snapshot: nothing is judged
    old_generation by it."""
    clock, fleet = ManualClock(), Fleet()
    fleet.engines["e1"] = ScriptedEngine("e1", version="v1")
    agent, registry, shipper = make_agent(fleet, clock)
    await registry.register(Registration("e1", "http://e1", "v1", "z1", "r1"))

    class Snapshots:
        current = RoutingSnapshot.model_validate({"version": 1, "models": {}})

    agent.snapshots = Snapshots()  # type: ignore[assignment]
    assert agent.expected_versions() is None
    await settle(agent, clock)
    assert not [e for e in shipper.buffer if e.kind == "probe.verdict" and e.detail["verdict"] != "ok"]


def pool_settings(tmp_path: Path) -> dict:
    return {"pool": {"model": "m", "versions": {"v1": str(tmp_path)}, "state_dir": str(tmp_path),
                     "zones": {"z1": {"serving": 1, "warm": 0}, "z2": {"serving": 0, "warm": 1}}}}


async def test_pool_fills_zones_then_promotes_warm_across_zones_and_backfills_a_loss(tmp_path: Path) -> None:
    clock, fleet = ManualClock(), Fleet()
    agent, registry, shipper = make_agent(fleet, clock, **pool_settings(tmp_path))
    await settle(agent, clock, 4)
    states = {i.zone: i.state for i in agent.instances.values()}
    assert states == {"z1": InstanceState.SERVING, "z2": InstanceState.WARM}
    [serving] = [i for i in agent.instances.values() if i.state is InstanceState.SERVING]
    [lease] = await registry.live()
    assert lease.instance_id == serving.instance_id

    fleet.engines[serving.instance_id].live = False  # SIGKILL
    await settle(agent, clock)
    [promoted] = [i for i in agent.instances.values() if i.state is InstanceState.SERVING]
    assert promoted.zone == "z2"
    assert [lease.instance_id for lease in await registry.live()] == [promoted.instance_id]
    kinds = [(e.kind, e.detail.get("zone")) for e in shipper.buffer if e.kind.startswith("pool.")]
    assert ("pool.lost", "z1") in kinds and ("pool.promoted", "z2") in kinds
    # each event names the incarnation it judged: the lost one under the lease it had, though that is gone now
    [lost] = [e for e in shipper.buffer if e.kind == "pool.lost"]
    assert (lost.instance_id, lost.generation) == (serving.instance_id, lease.generation)
    assert {e.kind: e.detail["changes_routing"] for e in shipper.buffer if e.kind.startswith("pool.")} == {
        "pool.started": False, "pool.lost": True, "pool.promoted": True}
    # z1 is backfilled cold, becomes warm and takes its serving share back; z2's instance is retired
    # and z2 backfilled warm
    await settle(agent, clock, 6)
    assert sorted((i.zone, i.state) for i in agent.instances.values()) == [
        ("z1", InstanceState.SERVING), ("z2", InstanceState.WARM)]
    [z1_serving] = [i.instance_id for i in agent.instances.values() if i.state is InstanceState.SERVING]
    assert [lease.instance_id for lease in await registry.live()] == [z1_serving]
    assert promoted.instance_id not in agent.instances and promoted.instance_id in agent.driver.stopped
    [stopped] = [e for e in shipper.buffer if e.kind == "pool.stopped"]
    assert stopped.instance_id == promoted.instance_id and stopped.generation is not None


async def test_an_instance_the_agent_forgets_leaves_no_per_instance_series_behind(tmp_path: Path) -> None:
    """Every backfill is a new instance id: series of gone ones would grow /metrics without bound."""
    clock, fleet = ManualClock(), Fleet()
    agent, _, _ = make_agent(fleet, clock, **pool_settings(tmp_path))
    await settle(agent, clock, 4)
    [serving] = [i.instance_id for i in agent.instances.values() if i.state is InstanceState.SERVING]

    def canaries(instance_id: str) -> float | None:
        return agent.metrics.registry.get_sample_value("lifeline_agent_instance_canaries", {"instance": instance_id})

    assert canaries(serving) >= 1
    fleet.engines[serving].live = False
    await settle(agent, clock, 2)
    assert serving not in agent.instances and canaries(serving) is None
    assert all(canaries(i) is not None for i in agent.instances if agent.instances[i].canaries)


async def test_pool_puts_serving_where_the_plan_says_when_the_other_zone_loads_first(tmp_path: Path) -> None:
    clock, fleet = ManualClock(), Fleet()
    agent, registry, shipper = make_agent(fleet, clock, **pool_settings(tmp_path))
    original_start = agent.driver.start

    async def z1_loads_late(**kwargs):
        instance = await original_start(**kwargs)
        if kwargs["zone"] == "z1":
            fleet.engines[instance.instance_id].live = False
            loading.append(instance.instance_id)
        return instance

    loading: list[str] = []
    agent.driver.start = z1_loads_late
    agent.driver.alive = lambda instance_id: instance_id in fleet.engines  # loading is alive, just not answering
    await settle(agent, clock, 3)
    assert sorted((i.zone, i.state) for i in agent.instances.values()) == [
        ("z1", InstanceState.COLD), ("z2", InstanceState.SERVING)]  # z2 serves z1's share meanwhile
    fleet.engines[loading[0]].live = True
    await settle(agent, clock, 6)
    assert sorted((i.zone, i.state) for i in agent.instances.values()) == [
        ("z1", InstanceState.SERVING), ("z2", InstanceState.WARM)]
    assert [lease.instance_id for lease in await registry.live()] == [loading[0]]


async def test_pool_instance_with_wrong_output_is_never_warm_and_is_replaced(tmp_path: Path) -> None:
    clock, fleet = ManualClock(), Fleet()
    agent, registry, shipper = make_agent(fleet, clock, **pool_settings(tmp_path))
    original_start = agent.driver.start

    async def corrupt_first(**kwargs):
        instance = await original_start(**kwargs)
        if len(agent.driver.started) == 1:
            fleet.engines[instance.instance_id].output = [0, 0, 0]
        return instance

    agent.driver.start = corrupt_first
    await settle(agent, clock, 10)
    bad = agent.driver.started[0].instance_id
    assert bad in agent.driver.stopped
    assert bad not in {lease.instance_id for lease in await registry.live()}
    lost = [e for e in shipper.buffer if e.kind == "pool.lost" and e.instance_id == bad]
    assert len(lost) == 1 and "admission canary failed: canary: token 0 is 0, recorded 5" in lost[0].reason
    assert sorted(i.state for i in agent.instances.values()) == [InstanceState.SERVING, InstanceState.WARM]


async def test_pool_instance_whose_lease_lapsed_is_registered_again_after_a_fresh_canary(tmp_path: Path) -> None:
    clock, fleet = ManualClock(), Fleet()
    agent, registry, shipper = make_agent(fleet, clock, **pool_settings(tmp_path))
    await settle(agent, clock, 4)
    [serving] = [i for i in agent.instances.values() if i.state is InstanceState.SERVING]
    canaries = fleet.engines[serving.instance_id].canaries
    clock.advance(5)  # the agent stalled past the TTL
    await settle(agent, clock)
    assert await registry.live() == []
    await settle(agent, clock, 2)
    assert [(lease.instance_id, lease.generation) for lease in await registry.live()] == [(serving.instance_id, 2)]
    assert agent.instances[serving.instance_id].state is InstanceState.SERVING
    assert fleet.engines[serving.instance_id].canaries == canaries + 1  # a fresh admission canary first
    assert not any(e.kind in ("pool.lost", "pool.stopped") for e in shipper.buffer)
    assert agent.driver.stopped == []


async def test_serving_instance_that_blips_is_demoted_and_leased_again_later(tmp_path: Path) -> None:
    clock, fleet = ManualClock(), Fleet()
    agent, registry, shipper = make_agent(fleet, clock, **pool_settings(tmp_path))
    agent.driver.alive = lambda instance_id: instance_id in fleet.engines  # unreachable is not exited
    await settle(agent, clock, 4)
    [z1] = [i.instance_id for i in agent.instances.values() if i.state is InstanceState.SERVING]
    fleet.engines[z1].live = False
    await settle(agent, clock)
    assert agent.instances[z1].state is InstanceState.WARM  # released and demoted, not stopped
    [demoted] = [e for e in shipper.buffer if e.kind == "pool.demoted"]
    assert demoted.instance_id == z1 and demoted.routing_tier == "l7" and demoted.detail["state"] == "warm"
    assert demoted.generation == 1  # the lease it was ejected under, released just before the event
    [promoted] = [i.instance_id for i in agent.instances.values() if i.state is InstanceState.SERVING]
    assert promoted != z1 and [lease.instance_id for lease in await registry.live()] == [promoted]
    fleet.engines[z1].live = True
    await settle(agent, clock, 4)
    # fresh admission canary, then z1 takes its serving share back under a new generation
    assert agent.instances[z1].state is InstanceState.SERVING
    assert [(lease.instance_id, lease.generation) for lease in await registry.live()] == [(z1, 2)]
    assert z1 not in agent.driver.stopped and promoted in agent.driver.stopped
    assert not any(e.kind == "pool.lost" for e in shipper.buffer)


async def test_canary_record_on_the_snapshot_wins_over_the_file() -> None:
    clock, fleet = ManualClock(), Fleet()
    fleet.engines["e1"] = ScriptedEngine("e1")
    fleet.engines["e1"].output = [1, 1]
    agent, registry, shipper = make_agent(fleet, clock, renew_leases_for="http://e1")

    class Snapshots:
        current = RoutingSnapshot.model_validate({"version": 1, "models": {"m": {
            "aliases": {"prod": {"version": "v1", "revision": 1}},
            "versions": {"v1": {"version": "v1", "fingerprint": "f", "location": "/x",
                                "canary": {"prompt_token_ids": [3], "output_token_ids": [1, 1]}}}}}})

    agent.snapshots = Snapshots()  # type: ignore[assignment]
    await settle(agent, clock, 2)
    assert [lease.instance_id for lease in await registry.live()] == ["e1"]  # the file's record would refuse it


async def test_instances_serving_real_traffic_are_canaried_less_but_within_two_intervals() -> None:
    clock, fleet = ManualClock(), Fleet()
    fleet.engines["busy"] = ScriptedEngine("busy")
    fleet.engines["idle"] = ScriptedEngine("idle")
    agent, registry, shipper = make_agent(fleet, clock, renew_leases_for="http://busy,http://idle",
                                          canary_per_instance_per_s=0.5)
    await settle(agent, clock, 2)  # admission canaries (and perhaps a first routine one)
    before = {name: engine.canaries for name, engine in fleet.engines.items()}
    for _ in range(60):  # 30 s at 0.5 s a tick; the gateways report busy's successes every tick
        agent.credit_served({"busy": clock.utcnow()})
        await settle(agent, clock)
    busy, idle = (fleet.engines[n].canaries - before[n] for n in ("busy", "idle"))
    assert idle >= 30 * 0.5 * 0.8 - 1
    # credit saves canaries, never past 2 intervals (4 s) since the last, plus a tick and the canary itself
    assert 30 / (2 * 2 + 1) - 1 <= busy < idle


async def test_a_corrupted_engine_earning_served_credit_is_still_ejected_within_two_intervals() -> None:
    """It answers 200 to real traffic with wrong tokens: credit must not keep its canary away."""
    clock, fleet = ManualClock(), Fleet()
    fleet.engines["e1"] = ScriptedEngine("e1")
    agent, registry, shipper = make_agent(fleet, clock, renew_leases_for="http://e1", canary_per_instance_per_s=0.5)
    await settle(agent, clock, 2)
    assert [lease.instance_id for lease in await registry.live()] == ["e1"]
    fleet.engines["e1"].output = [5, 9, 7]  # weights corrupted in memory
    for _ in range(int(2 * 2 / 0.5) + 2):  # two 2 s intervals at 0.5 s a tick, and a tick's slack
        agent.credit_served({"e1": clock.utcnow()})
        await settle(agent, clock)
    assert agent.instances["e1"].verdict.value == "wrong_output"
    assert await registry.live() == []


async def test_engine_without_a_lease_of_its_own_is_leased_again_under_a_new_generation() -> None:
    clock, fleet = ManualClock(), Fleet()
    fleet.engines["e1"] = ScriptedEngine("e1")  # /healthz/generation says 1; no X-Lifeline-Generation
    agent, registry, _ = make_agent(fleet, clock, renew_leases_for="http://e1")
    await settle(agent, clock, 2)
    assert (await registry.live())[0].generation == 1
    fleet.engines["e1"].live = False
    await settle(agent, clock)
    assert await registry.live() == []
    canaries = fleet.engines["e1"].canaries
    fleet.engines["e1"].live = True
    await settle(agent, clock, 3)
    assert [lease.generation for lease in await registry.live()] == [2]
    assert agent.instances["e1"].unleasable is None
    assert fleet.engines["e1"].canaries == canaries + 1  # admitted again by a fresh canary


async def test_engine_stamping_its_own_lease_generation_is_not_leased_under_another() -> None:
    clock, fleet = ManualClock(), Fleet()
    fleet.engines["e1"] = ScriptedEngine("e1")
    fleet.engines["e1"].own_lease = True  # listed by mistake: it sends X-Lifeline-Generation: 1
    agent, registry, _ = make_agent(fleet, clock, renew_leases_for="http://e1")
    await settle(agent, clock, 2)
    assert (await registry.live())[0].generation == 1
    fleet.engines["e1"].live = False
    await settle(agent, clock)
    fleet.engines["e1"].live = True
    await settle(agent, clock, 3)
    assert await registry.live() == []  # generation 2 would have the gateway drop every frame
    assert agent.instances["e1"].unleasable == (
        "engine stamps generation 1 (a lease of its own); the agent's lease would be 2")


async def test_engine_restarted_at_the_same_url_is_released_and_leased_again_after_a_fresh_canary() -> None:
    clock, fleet = ManualClock(), Fleet()
    fleet.engines["e1"] = ScriptedEngine("e1")
    agent, registry, _ = make_agent(fleet, clock, renew_leases_for="http://e1")
    await settle(agent, clock, 2)
    assert [lease.generation for lease in await registry.live()] == [1]
    canaries = fleet.engines["e1"].canaries
    fleet.engines["e1"].boot_generation, fleet.engines["e1"].started_at = 2, 100.0  # restarted between probes
    fleet.engines["e1"].output = [0, 0, 0]  # and loaded something else: the old canary must not admit it
    await settle(agent, clock)
    assert await registry.live() == []
    assert fleet.engines["e1"].canaries == canaries + 1
    await settle(agent, clock, 4)
    assert await registry.live() == []
    fleet.engines["e1"].output = [5, 6, 7]
    fleet.engines["e1"].started_at = 200.0  # restarted again, same boot counter: started_at tells
    await settle(agent, clock, 2)
    assert [lease.generation for lease in await registry.live()] == [2]


async def test_a_restarted_agent_takes_over_the_lease_it_held_before() -> None:
    clock, fleet = ManualClock(), Fleet()
    fleet.engines["e1"] = ScriptedEngine("e1")
    agent, registry, shipper = make_agent(fleet, clock, renew_leases_for="http://e1")
    await settle(agent, clock, 2)
    [before] = await registry.live()
    # the agent process dies without releasing; a new one starts within the TTL on the same registry
    successor = Agent(agent.settings, registry=registry, http=agent.http, clock=clock, shipper=shipper,
                      canary_records={"v1": RECORD})
    await settle(successor, clock, 8)
    [after] = await registry.live()
    assert (after.instance_id, after.generation) == (before.instance_id, before.generation)  # renewed, not re-registered
    assert successor.instances["e1"].origin == "external"


async def test_warm_instance_rides_out_a_blip_but_not_a_failure(tmp_path: Path) -> None:
    clock, fleet = ManualClock(), Fleet()
    agent, registry, shipper = make_agent(fleet, clock, **pool_settings(tmp_path))
    agent.driver.alive = lambda instance_id: instance_id in fleet.engines  # unreachable is not exited
    await settle(agent, clock, 4)
    [warm] = [i.instance_id for i in agent.instances.values() if i.state is InstanceState.WARM]
    fleet.engines[warm].live = False
    await settle(agent, clock, 2)
    fleet.engines[warm].live = True
    await settle(agent, clock, 2)
    assert agent.instances[warm].state is InstanceState.WARM  # two failed probes: kept
    fleet.engines[warm].live = False
    await settle(agent, clock, 3)
    assert warm not in agent.instances and warm in agent.driver.stopped


async def test_report_carries_each_instance_verdict_pool_state_lease_and_last_canary(tmp_path: Path) -> None:
    clock, fleet = ManualClock(), Fleet()
    agent, registry, _ = make_agent(fleet, clock, agent_id="agent-7", **pool_settings(tmp_path))
    await settle(agent, clock, 4)
    report = agent.report()
    assert (report.region, report.agent_id, report.snapshot_version) == ("r1", "agent-7", None)
    assert report.sent_at == clock.utcnow()
    by_zone = {i.zone: i for i in report.instances}
    [lease] = await registry.live()
    serving, warm = by_zone["z1"], by_zone["z2"]
    assert (serving.pool_state, serving.verdict, serving.lease_held, serving.lease_generation) == (
        "serving", "ok", True, lease.generation)
    assert (warm.pool_state, warm.verdict, warm.lease_held, warm.lease_generation) == ("warm", "ok", False, None)
    assert serving.canary_verdict == "ok" and serving.canary_at is not None and serving.canaries >= 1
    assert serving.verdict_since is not None and serving.verdict_since <= serving.canary_at

    fleet.engines[warm.instance_id].output = [5, 9, 7]  # wrong output on the next canary
    agent.budget.note_served(warm.instance_id, clock.now() - 100)  # due at once
    before = clock.utcnow()
    for _ in range(40):
        await settle(agent, clock)
        if warm.instance_id not in agent.instances:
            break
    # lost and replaced: the report shows only what the agent holds now
    assert warm.instance_id not in {i.instance_id for i in agent.report().instances}
    assert all(i.verdict_since is not None for i in agent.report().instances if i.verdict is not None)
    assert agent.report().sent_at > before


async def test_report_outcomes_are_counted_and_an_unreachable_control_plane_costs_only_freshness() -> None:
    from warm_pool.report import ReportSender

    clock, fleet = ManualClock(), Fleet()
    fleet.engines["e1"] = ScriptedEngine("e1")
    up = False
    seen: list[tuple[str, str, bytes]] = []

    def control_plane(request: httpx.Request) -> httpx.Response:
        if not up:
            raise httpx.ConnectError("down")
        seen.append((request.method, request.url.path, request.content))
        return httpx.Response(200, json={})

    agent, _, _ = make_agent(fleet, clock, renew_leases_for="http://e1")
    agent.reporter = ReportSender(httpx.AsyncClient(transport=httpx.MockTransport(control_plane)), "http://cp",
                                  token="t")
    await settle(agent, clock, 2)
    assert await agent.send_report() == "unreachable"
    up = True
    assert await agent.send_report() == "sent"
    [(method, path, body)] = seen
    assert (method, path) == ("PUT", "/api/v1/agents/r1")
    [instance] = AgentReport.model_validate_json(body).instances
    assert (instance.instance_id, instance.origin, instance.lease_held, instance.pool_state) == (
        "e1", "external", True, None)
    samples = {s.labels["outcome"]: s.value for m in agent.metrics.registry.collect() if m.name == "lifeline_agent_reports"
               for s in m.samples if s.name.endswith("_total")}
    assert samples == {"unreachable": 1.0, "sent": 1.0}


async def test_report_and_board_carry_the_generation_of_an_engine_that_holds_its_own_lease() -> None:
    clock, fleet = ManualClock(), Fleet()
    fleet.engines["e1"] = ScriptedEngine("e1")
    fleet.engines["e1"].output = [5, 9, 7]
    agent, registry, _ = make_agent(fleet, clock)
    own = await registry.register(Registration("e1", "http://e1", "v1", "z1", "r1"))  # renews its own lease
    agent.budget.note_served("e1", clock.now() - 100)
    for _ in range(40):
        await settle(agent, clock)
        await registry.renew("e1", own.generation)
        if agent.instances["e1"].verdict is Verdict.WRONG_OUTPUT:
            break
    [instance] = agent.report().instances
    assert (instance.origin, instance.lease_held, instance.lease_generation, instance.verdict) == (
        "registry", False, own.generation, "wrong_output")
    [entry] = agent.verdicts().verdicts
    assert (entry.instance_id, entry.generation, entry.verdict, entry.action) == (
        "e1", own.generation, "wrong_output", "eject")


async def test_run_ticks_stops_by_its_event_even_when_a_tick_swallows_the_cancellation() -> None:
    """Python 3.11's asyncio.wait_for can swallow a cancel that lands as its inner call completes (the health
    probes use it); a loop stopped by cancel() alone then ticks on forever (bench/pool.py hung so)."""
    clock, fleet = ManualClock(), Fleet()
    agent, _, _ = make_agent(fleet, clock, probe_interval=0.01, lease_ttl=1.0)
    entered = asyncio.Event()

    async def tick_that_swallows_a_cancel() -> None:
        entered.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)

    agent.tick = tick_that_swallows_a_cancel  # type: ignore[method-assign]
    stop = asyncio.Event()
    ticking = asyncio.create_task(agent.run_ticks(stop))
    await entered.wait()
    stop.set()
    ticking.cancel()
    await asyncio.wait_for(ticking, 5)  # a bound for a hang, not a speed check
    assert ticking.done() and not ticking.cancelled()
