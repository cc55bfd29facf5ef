"""The agent reports zone and region faults to cutover-escalations once per fault, on virtual time.

Scripted engines and a scripted control plane (httpx.MockTransport): a zone
whose engines stop answering is reported after `fault_rounds` rounds with
the instances it saw, exactly once while it persists (also when the first
posts failed), not at all if it clears before it was taken, and again —
under a new id — when it returns after clearing.
"""

from __future__ import annotations

import asyncio
import json

import httpx

from common.clock import ManualClock
from warm_pool.fault import ESCALATIONS_PATH, FaultReporter
from tests.unit.warm_pool.test_pool_agent import Fleet, ScriptedEngine, make_agent, settle

ENGINES = [{"url": f"http://{i}", "instance_id": i, "version": "v1", "zone": z}
           for i, z in (("a1", "za"), ("a2", "za"), ("b1", "zb"))]


class ScriptedControlPlane:
    def __init__(self) -> None:
        self.posts: list[dict] = []
        self.status = 200

    def transport(self) -> httpx.MockTransport:
        def handler(request: httpx.Request) -> httpx.Response:
            assert request.url.path == ESCALATIONS_PATH
            assert request.headers["authorization"] == "Bearer agent-secret"
            self.posts.append(json.loads(request.content))
            if self.status == 0:
                raise httpx.ConnectError("control plane away")
            return httpx.Response(self.status, json={"decisions": [{"action": "cut_over"}], "cutovers": []}
                                  if self.status == 200 else {"error": {"type": "x", "message": "no"}})
        return httpx.MockTransport(handler)


async def rounds(agent, clock, n: int) -> None:
    for _ in range(n):
        await settle(agent, clock)
        if agent.fault_reports.task is not None:
            await asyncio.gather(agent.fault_reports.task, return_exceptions=True)


def build(fleet: Fleet, clock: ManualClock, cp: ScriptedControlPlane):
    for engine in ENGINES:
        fleet.engines[engine["instance_id"]] = ScriptedEngine(engine["instance_id"], engine["zone"])
    agent, _, _ = make_agent(fleet, clock, renew_leases_for=ENGINES, fault_rounds=3)
    agent.fault_reporter = FaultReporter(httpx.AsyncClient(transport=cp.transport()), "http://cp",
                                         token="agent-secret")
    return agent


def down(fleet: Fleet, *names: str, live: bool = False) -> None:
    for name in names:
        fleet.engines[name].live = live


async def test_a_zone_down_is_reported_once_with_its_instances_while_it_persists() -> None:
    clock, fleet, cp = ManualClock(), Fleet(), ScriptedControlPlane()
    agent = build(fleet, clock, cp)
    await rounds(agent, clock, 3)
    down(fleet, "a1", "a2")
    await rounds(agent, clock, 2)
    assert cp.posts == []  # two rounds are not yet a fault
    await rounds(agent, clock, 1)
    [post] = cp.posts
    assert post["scope"] == {"kind": "zone", "region": "r1", "name": "za"}
    assert [(i["instance_id"], i["verdict"]) for i in post["evidence"]["instances"]] == [("a1", "error"),
                                                                                         ("a2", "error")]
    assert post["evidence"]["healthy_zones"] == {"zb": ["b1"]} and post["evidence"]["rounds"] == 3
    await rounds(agent, clock, 20)
    assert len(cp.posts) == 1  # persisting: never a second report, never a second cutover
    assert agent.status()["faults"]["reported"] == {post["fault_id"]: "accepted"}
    assert agent.metrics.fault_reports.labels("accepted")._value.get() == 1


async def test_a_report_that_did_not_arrive_is_sent_again_under_the_same_id_until_taken() -> None:
    clock, fleet, cp = ManualClock(), Fleet(), ScriptedControlPlane()
    agent = build(fleet, clock, cp)
    await rounds(agent, clock, 3)
    cp.status = 0
    down(fleet, "a1", "a2")
    await rounds(agent, clock, 4)
    cp.status = 503
    await rounds(agent, clock, 1)
    cp.status = 200
    await rounds(agent, clock, 5)
    assert len(cp.posts) >= 3 and len({p["fault_id"] for p in cp.posts}) == 1  # one fault, one ladder
    assert agent.metrics.fault_reports.labels("accepted")._value.get() == 1
    assert agent.metrics.fault_reports.labels("retry")._value.get() == len(cp.posts) - 1


async def test_a_refused_report_is_not_sent_again() -> None:
    clock, fleet, cp = ManualClock(), Fleet(), ScriptedControlPlane()
    agent = build(fleet, clock, cp)
    cp.status = 403
    await rounds(agent, clock, 3)
    down(fleet, "a1", "a2")
    await rounds(agent, clock, 10)
    assert len(cp.posts) == 1
    assert list(agent.status()["faults"]["reported"].values()) == ["refused"]


async def test_a_fault_that_clears_and_returns_is_a_new_fault_and_the_whole_region_down_is_one() -> None:
    clock, fleet, cp = ManualClock(), Fleet(), ScriptedControlPlane()
    agent = build(fleet, clock, cp)
    await rounds(agent, clock, 3)
    down(fleet, "a1", "a2")
    await rounds(agent, clock, 4)
    down(fleet, "a1", "a2", live=True)
    await rounds(agent, clock, 5)
    assert agent.status()["faults"]["open"] == {}
    down(fleet, "a1", "a2")
    await rounds(agent, clock, 4)
    assert [p["scope"]["name"] for p in cp.posts] == ["za", "za"]
    assert cp.posts[0]["fault_id"] != cp.posts[1]["fault_id"]
    down(fleet, "b1")
    await rounds(agent, clock, 4)
    assert [p["scope"] for p in cp.posts[2:]] == [{"kind": "region", "region": "r1"}]


async def test_a_fault_that_clears_before_the_control_plane_takes_it_is_never_sent() -> None:
    clock, fleet, cp = ManualClock(), Fleet(), ScriptedControlPlane()
    agent = build(fleet, clock, cp)
    await rounds(agent, clock, 3)
    cp.status = 0
    down(fleet, "a1", "a2")
    await rounds(agent, clock, 3)
    down(fleet, "a1", "a2", live=True)
    await rounds(agent, clock, 4)
    sent = len(cp.posts)
    cp.status = 200
    await rounds(agent, clock, 5)
    assert len(cp.posts) == sent and agent.status()["faults"]["unreported"] == []


async def test_a_pool_zone_whose_processes_exit_is_a_zone_fault_though_backfills_start_there(tmp_path) -> None:
    clock, fleet, cp = ManualClock(), Fleet(), ScriptedControlPlane()
    agent, _, _ = make_agent(fleet, clock, fault_rounds=3, pool={
        "model": "m", "versions": {"v1": str(tmp_path)}, "state_dir": str(tmp_path),
        "zones": {"za": {"serving": 1, "warm": 0}, "zb": {"serving": 1, "warm": 0}}})
    agent.fault_reporter = FaultReporter(httpx.AsyncClient(transport=cp.transport()), "http://cp",
                                         token="agent-secret")
    await rounds(agent, clock, 6)
    [lost] = [i for i in agent.instances.values() if i.zone == "za"]
    assert agent.faults.members.keys() == {i.instance_id for i in agent.instances.values()}
    for _ in range(6):  # za's machines are gone: its process exits, and every backfill there never answers
        for engine in fleet.engines.values():
            if engine.zone == "za":
                engine.live = False
        await rounds(agent, clock, 1)
    assert len([s for s in agent.driver.started if s.zone == "za"]) > 1  # backfills were started, and failed
    [post] = cp.posts
    assert post["scope"] == {"kind": "zone", "region": "r1", "name": "za"}
    [instance] = post["evidence"]["instances"]
    assert (instance["instance_id"], instance["verdict"]) == (lost.instance_id, "gone")
    assert "the process exited" in instance["reason"]
