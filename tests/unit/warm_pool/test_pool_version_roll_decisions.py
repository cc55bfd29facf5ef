"""A promotion rolls the pool to the new version and keeps the plan's share warm on the previous one; a rollback
is then a routing change (blue/green), not a load. Virtual time, scripted engines, a fake driver."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest

from common.clock import ManualClock
from contract.snapshot import RoutingSnapshot
from tests.unit.warm_pool.test_pool_agent import RECORD, Fleet, make_agent, settle
from warm_pool.settings import AgentSettings
from warm_pool.states import InstanceState
from warm_pool.version_roll import Member, decide, infer_previous

S = InstanceState
GRACE = 3.0  # pool.old_generation_grace, seconds


class Snapshots:
    """The agent's SnapshotClient as far as it reads it: the current snapshot."""

    def __init__(self) -> None:
        self.current: RoutingSnapshot | None = None

    def point(self, version: str, revision: int) -> None:
        self.current = RoutingSnapshot.model_validate({"version": revision, "models": {"m": {
            "aliases": {"prod": {"version": version, "revision": revision}},
            "versions": {v: {"version": v, "fingerprint": "f", "location": "/x"} for v in ("v1", "v2")}}}})


def settings(tmp_path: Path, warm_previous: int = 1) -> dict:
    zone = {"serving": 1, "warm": 1, "warm_previous": warm_previous}
    return {"pool": {"model": "m", "versions": {"v1": str(tmp_path), "v2": str(tmp_path)}, "state_dir": str(tmp_path),
                     "zones": {"z1": zone, "z2": zone}, "old_generation_grace": GRACE}}


def layout(agent) -> Counter:
    return Counter((i.zone, i.version, i.state) for i in agent.instances.values() if i.origin == "pool")


async def rolled_pool(tmp_path: Path, warm_previous: int = 1):
    clock, fleet = ManualClock(), Fleet()
    agent, registry, shipper = make_agent(fleet, clock, **settings(tmp_path, warm_previous))
    agent.canary_records["v2"] = RECORD
    agent.snapshots = snapshots = Snapshots()  # type: ignore[assignment]
    snapshots.point("v1", 1)
    await settle(agent, clock, 4)
    assert layout(agent) == Counter({(z, "v1", s): 1 for z in ("z1", "z2") for s in (S.SERVING, S.WARM)})
    return clock, fleet, agent, registry, shipper, snapshots


async def serving_versions(registry) -> Counter:
    return Counter(lease.version for lease in await registry.live())


async def test_a_promotion_rolls_serving_to_the_new_version_and_keeps_the_previous_share_warm(tmp_path: Path):
    clock, fleet, agent, registry, shipper, snapshots = await rolled_pool(tmp_path)
    snapshots.point("v2", 2)
    await settle(agent, clock, 4)  # v2 loads (cold → warm) and takes the serving share
    assert await serving_versions(registry) == Counter({"v2": 2, "v1": 2})  # v1 finishes its established sessions
    assert all(i.verdict.value == "old_generation" for i in agent.instances.values()
               if i.version == "v1" and i.state is S.SERVING)

    await settle(agent, clock, 8)  # past the grace: the old serving set goes, the previous share stays warm
    assert await serving_versions(registry) == Counter({"v2": 2})
    assert layout(agent) == Counter({**{(z, "v2", s): 1 for z in ("z1", "z2") for s in (S.SERVING, S.WARM)},
                                     **{(z, "v1", S.WARM): 1 for z in ("z1", "z2")}})
    stopped = [e for e in shipper.buffer if e.kind == "pool.stopped"]
    assert len(stopped) == 2 and all(e.detail["version"] == "v1" and e.detail["changes_routing"] for e in stopped)
    assert Counter(i.version for i in fleet.engines.values()) == Counter({"v2": 4, "v1": 2})


async def test_a_rollback_to_the_previous_version_promotes_its_warm_share_at_once(tmp_path: Path):
    clock, fleet, agent, registry, shipper, snapshots = await rolled_pool(tmp_path)
    snapshots.point("v2", 2)
    await settle(agent, clock, 12)
    started = len(agent.driver.started)
    before = len([e for e in shipper.buffer if e.kind == "pool.promoted"])

    snapshots.point("v1", 3)  # roll back
    await settle(agent, clock)  # one tick: the warm v1 share is leased, nothing had to load
    assert (await serving_versions(registry))["v1"] == 2
    promoted = [e for e in shipper.buffer if e.kind == "pool.promoted"][before:]
    assert [e.detail["version"] for e in promoted] == ["v1", "v1"] and all(e.routing_tier == "l7" for e in promoted)
    assert all(s.version == "v1" for s in agent.driver.started[started:])  # backfill only, after the promotion

    await settle(agent, clock, 10)  # v2 is now the previous version: its share stays warm
    assert await serving_versions(registry) == Counter({"v1": 2})
    assert layout(agent) == Counter({**{(z, "v1", s): 1 for z in ("z1", "z2") for s in (S.SERVING, S.WARM)},
                                     **{(z, "v2", S.WARM): 1 for z in ("z1", "z2")}})


async def test_without_a_previous_share_the_old_version_is_retired_entirely(tmp_path: Path):
    clock, fleet, agent, registry, shipper, snapshots = await rolled_pool(tmp_path, warm_previous=0)
    snapshots.point("v2", 2)
    await settle(agent, clock, 12)
    assert await serving_versions(registry) == Counter({"v2": 2})
    assert layout(agent) == Counter({(z, "v2", s): 1 for z in ("z1", "z2") for s in (S.SERVING, S.WARM)})
    assert Counter(i.version for i in fleet.engines.values()) == Counter({"v2": 4})


async def test_old_serving_instances_stay_until_the_new_version_covers_the_plan(tmp_path: Path):
    clock, fleet, agent, registry, shipper, snapshots = await rolled_pool(tmp_path)
    original_start = agent.driver.start

    async def v2_never_answers(**kwargs):
        instance = await original_start(**kwargs)
        if kwargs["version"] == "v2":
            fleet.engines[instance.instance_id].live = False
        return instance

    agent.driver.start = v2_never_answers
    agent.driver.alive = lambda instance_id: instance_id in fleet.engines  # loading, not exited
    snapshots.point("v2", 2)
    await settle(agent, clock, 20)  # long past the grace, but nothing of v2 can serve yet
    assert await serving_versions(registry) == Counter({"v1": 2})


def test_the_previous_share_and_the_grace_are_typed_settings(tmp_path: Path):
    pool = AgentSettings(region="r1", **settings(tmp_path)).pool
    assert pool.zones["z1"].warm_previous == 1 and pool.old_generation_grace == timedelta(seconds=GRACE)
    with pytest.raises(ValueError, match="warm_previous"):
        AgentSettings(region="r1", **{"pool": {**settings(tmp_path)["pool"],
                                               "zones": {"z1": {"serving": 1, "warm": 0, "warm_previous": -1}}}})


def m(instance_id: str, version: str, state: S, zone: str = "z1", in_flight: int | None = 0,
      overdue: bool = False) -> Member:
    """Idle unless told: the table below is about shares and the grace; the drain table about requests."""
    return Member(instance_id, zone, version, state, in_flight=in_flight, drain_overdue=overdue)


@pytest.mark.parametrize(("name", "members", "previous", "share", "may_go", "demote", "retire", "start"), [
    ("nothing old yet: the previous share is started", [m("a", "v2", S.SERVING)], "v1", {"z1": 1}, True, [], [], {"z1": 1}),
    ("old serving waits while the new version does not cover the plan",
     [m("a", "v1", S.SERVING), m("b", "v1", S.SERVING)], "v1", {"z1": 1}, False, [], [], {}),
    ("then one takes the share warm, the other is retired",
     [m("a", "v1", S.SERVING), m("b", "v1", S.SERVING)], "v1", {"z1": 1}, True, ["a"], ["b"], {}),
    ("an already warm one keeps the share before a serving one is demoted",
     [m("a", "v1", S.SERVING), m("w", "v1", S.WARM)], "v1", {"z1": 1}, True, [], ["a"], {}),
    ("warm beyond the share and other versions are retired",
     [m("a", "v1", S.WARM), m("b", "v1", S.WARM), m("c", "v0", S.WARM)], "v1", {"z1": 1}, False, [], ["b", "c"], {}),
    ("a loading one counts toward the share and is never retired while cold",
     [m("a", "v1", S.COLD), m("b", "v0", S.COLD)], "v1", {"z1": 2}, True, [], [], {"z1": 1}),
    ("the share is per zone", [m("a", "v1", S.WARM, "z1")], "v1", {"z1": 1, "z2": 1}, True, [], [], {"z2": 1}),
    ("no previous version: every old one goes, nothing is started",
     [m("a", "v1", S.SERVING), m("b", "v1", S.WARM)], None, {"z1": 1}, True, [], ["b", "a"], {}),
    ("the previous version is the desired one again: nothing is old",
     [m("a", "v2", S.WARM)], "v2", {"z1": 1}, True, [], [], {}),
])
def test_roll_decisions(name, members, previous, share, may_go, demote, retire, start) -> None:
    roll = decide(members, desired="v2", previous=previous, previous_share=share, old_serving_may_go=may_go)
    assert (list(roll.demote), list(roll.retire), dict(roll.start_previous)) == (demote, retire, start), name


@pytest.mark.parametrize(("name", "members", "may_go", "retire", "cut", "waiting"), [
    ("idle after the grace: retired", [m("a", "v1", S.SERVING, in_flight=0)], True, ["a"], [], []),
    ("a stream running after the grace: it waits", [m("a", "v1", S.SERVING, in_flight=1)], True, [], [], ["a"]),
    ("requests waiting for a slot count as in flight", [m("a", "v1", S.SERVING, in_flight=3)], True, [], [], ["a"]),
    ("a count not read yet is not idle", [m("a", "v1", S.SERVING, in_flight=None)], True, [], [], ["a"]),
    ("past the drain deadline it goes, cut", [m("a", "v1", S.SERVING, in_flight=2, overdue=True)], True,
     ["a"], ["a"], []),
    ("past the deadline, never read: cut too", [m("a", "v1", S.SERVING, in_flight=None, overdue=True)], True,
     ["a"], ["a"], []),
    ("idle once overdue is not a cut", [m("a", "v1", S.SERVING, in_flight=0, overdue=True)], True, ["a"], [], []),
    ("within the grace nothing waits: it keeps serving", [m("a", "v1", S.SERVING, in_flight=1)], False, [], [], []),
    ("a warm one beyond the share waits for its streams as well",
     [m("a", "v1", S.WARM, in_flight=1), m("b", "v1", S.WARM, in_flight=1)], False, [], [], ["b"]),
    ("each instance by its own count",
     [m("a", "v1", S.SERVING, in_flight=0), m("b", "v1", S.SERVING, in_flight=4)], True, ["a"], [], ["b"]),
])
def test_roll_retires_an_instance_only_when_its_requests_are_done_or_its_drain_deadline_passed(
        name, members, may_go, retire, cut, waiting) -> None:
    roll = decide(members, desired="v2", previous="v1", previous_share={"z1": 1} if any(
        x.state is S.WARM for x in members) else {"z1": 0}, old_serving_may_go=may_go)
    assert (list(roll.retire), list(roll.cut), list(roll.waiting), list(roll.demote)) == (retire, cut, waiting, []), name


def test_a_demotion_waits_for_no_request_the_process_stays() -> None:
    roll = decide([m("a", "v1", S.SERVING, in_flight=5)], desired="v2", previous="v1", previous_share={"z1": 1},
                  old_serving_may_go=True)
    assert (roll.demote, roll.retire, roll.waiting) == (("a",), (), ())


def test_the_previous_version_an_agent_did_not_see_is_the_one_most_of_the_pool_runs() -> None:
    members = [m("a", "v1", S.WARM), m("b", "v1", S.SERVING), m("c", "v0", S.WARM), m("d", "vX", S.WARM)]
    assert infer_previous(members, desired="v2", known={"v0", "v1", "v2"}) == "v1"
    assert infer_previous([m("a", "v2", S.WARM)], desired="v2", known={"v1", "v2"}) is None


async def test_a_serving_instance_of_the_previous_version_is_demoted_in_place_when_the_share_needs_it(tmp_path: Path):
    clock, fleet, agent, registry, shipper, snapshots = await rolled_pool(tmp_path, warm_previous=2)
    v1 = {i.instance_id for i in agent.instances.values() if i.version == "v1"}
    snapshots.point("v2", 2)
    await settle(agent, clock, 12)
    assert await serving_versions(registry) == Counter({"v2": 2})
    assert {i.instance_id for i in agent.instances.values() if i.version == "v1" and i.state is S.WARM} == v1
    demoted = [e for e in shipper.buffer if e.kind == "pool.demoted"]
    assert len(demoted) == 2 and all(e.detail["changes_routing"] and e.routing_tier == "l7" for e in demoted)
    assert not set(agent.driver.stopped) & v1


async def test_an_alias_moved_to_a_version_the_pool_cannot_start_keeps_the_pool_where_it_is(tmp_path: Path):
    clock, fleet, agent, registry, shipper, snapshots = await rolled_pool(tmp_path)
    snapshots.point("v2", 2)
    await settle(agent, clock, 12)
    assert await serving_versions(registry) == Counter({"v2": 2})
    snapshots.current = RoutingSnapshot.model_validate({"version": 3, "models": {"m": {
        "aliases": {"prod": {"version": "v9", "revision": 3}},
        "versions": {v: {"version": v, "fingerprint": "f", "location": "/x"} for v in ("v1", "v2", "v9")}}}})
    started, events = len(agent.driver.started), len(shipper.buffer)
    await settle(agent, clock, 12)  # not the pool's first version (v1): nothing rolls, nothing starts
    assert agent.desired_version() == "v2" and len(agent.driver.started) == started
    assert not [e for e in list(shipper.buffer)[events:] if e.kind.startswith("pool.")]
    assert await serving_versions(registry) == Counter({"v2": 2})


async def test_an_old_instance_with_a_stream_running_past_the_grace_is_retired_once_it_finishes(tmp_path: Path):
    clock, fleet, agent, registry, shipper, snapshots = await rolled_pool(tmp_path, warm_previous=0)
    busy, idle = sorted(i.instance_id for i in agent.instances.values() if i.version == "v1" and i.state is S.SERVING)
    fleet.engines[busy].running = 1  # a long stream on the old version
    snapshots.point("v2", 2)
    await settle(agent, clock, 20)  # long past the grace (3 s): the idle one went, the busy one waits
    assert idle in agent.driver.stopped and busy not in agent.driver.stopped
    assert agent.instances[busy].state is S.SERVING and agent.instances[busy].in_flight == 1
    assert busy in {lease.instance_id for lease in await registry.live()}  # established sessions finish
    assert agent.metrics.registry.get_sample_value("lifeline_agent_roll_waiting_instances") == 1

    fleet.engines[busy].running, fleet.engines[busy].waiting = 0, 1  # one more queued is still in flight
    await settle(agent, clock, 4)
    assert busy not in agent.driver.stopped
    fleet.engines[busy].waiting = 0
    await settle(agent, clock, 2)
    assert busy in agent.driver.stopped and busy not in agent.instances
    stopped = {e.instance_id: e.detail for e in shipper.buffer if e.kind == "pool.stopped"}
    assert (stopped[busy]["drain_cut"], stopped[busy]["in_flight"]) == (False, 0)
    assert agent.metrics.registry.get_sample_value("lifeline_agent_roll_retired_total", {"drain": "idle"}) == 4  # and the warm two
    assert agent.metrics.registry.get_sample_value("lifeline_agent_roll_waiting_instances") == 0


@pytest.mark.parametrize("engine_says", ["busy", "no metrics"])
async def test_an_old_instance_still_busy_at_the_drain_deadline_is_retired_and_the_event_says_it_was_cut(
        tmp_path: Path, engine_says: str):
    clock, fleet = ManualClock(), Fleet()
    pool = settings(tmp_path, warm_previous=0)["pool"] | {"old_generation_drain_timeout": 30}
    agent, registry, shipper = make_agent(fleet, clock, pool=pool)
    agent.canary_records["v2"] = RECORD
    agent.snapshots = snapshots = Snapshots()  # type: ignore[assignment]
    snapshots.point("v1", 1)
    await settle(agent, clock, 4)
    old = {i.instance_id for i in agent.instances.values() if i.version == "v1" and i.state is S.SERVING}
    for instance_id in old:
        if engine_says == "busy":
            fleet.engines[instance_id].running = 2
        else:  # /metrics gone: the count is unknown, never taken for idle
            fleet.engines[instance_id].running = None  # type: ignore[assignment]
    snapshots.point("v2", 2)
    await settle(agent, clock, 40)  # 20 s: past the grace, within the drain deadline
    assert not old & set(agent.driver.stopped)
    await settle(agent, clock, 60)  # 30 s more: the deadline passed
    assert old <= set(agent.driver.stopped)
    cut = [e for e in shipper.buffer if e.kind == "pool.stopped" and e.instance_id in old]
    assert len(cut) == 2 and all(e.detail["drain_cut"] is True for e in cut)
    assert {e.detail["in_flight"] for e in cut} == ({2} if engine_says == "busy" else {None})
    assert all("drain cut after 30 s" in e.reason for e in cut)
    assert agent.metrics.registry.get_sample_value("lifeline_agent_roll_retired_total", {"drain": "cut"}) == 2
    assert await serving_versions(registry) == Counter({"v2": 2})


def test_the_drain_deadline_is_a_typed_setting(tmp_path: Path) -> None:
    pool = AgentSettings(region="r1", **settings(tmp_path)).pool
    assert pool.old_generation_drain_timeout == timedelta(minutes=10)
    with pytest.raises(ValueError, match="old_generation_drain_timeout"):
        AgentSettings(region="r1", pool={**settings(tmp_path)["pool"], "old_generation_drain_timeout": 0})
