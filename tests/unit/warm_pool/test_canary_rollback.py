"""A version on a non-prod alias that fails its canary everywhere is posted once to the catalog for a rollback.

`failed_versions` is table-tested; the agent is run on virtual time with
scripted engines and a scripted control plane (httpx.MockTransport): two
instances of v2 (the `canary` alias) answering wrong are one report with
the alias revision the snapshot showed, never for prod, never while one
instance of v2 still passes, and again only once the alias moves to a new
revision.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from common.clock import ManualClock
from contract.snapshot import RoutingSnapshot
from tests.unit.warm_pool.test_pool_agent import Fleet, ScriptedEngine, make_agent, settle
from warm_pool.canary_rollback import CanaryOutcome, CanaryRollbackReporter, failed_versions

CANARY = {"prompt_token_ids": [1, 2], "output_token_ids": [5, 6, 7], "max_ttft_s": 5.0}


def snapshot(canary: str = "v2", revision: int = 2, prod: str = "v1") -> RoutingSnapshot:
    versions = {v: {"version": v, "fingerprint": "f", "location": f"/{v}", "canary": CANARY}
                for v in {prod, canary}}
    return RoutingSnapshot.model_validate({"version": 1, "models": {"tiny": {
        "aliases": {"prod": {"version": prod, "revision": 1}, "canary": {"version": canary, "revision": revision}},
        "versions": versions}}})


def outcome(instance: str, version: str, verdict: str) -> CanaryOutcome:
    return CanaryOutcome(instance, version, verdict, "canary: token 0 is 9, recorded 5")


@pytest.mark.parametrize(("snap", "outcomes", "expected"), [
    (snapshot(), [outcome("b1", "v2", "wrong_output"), outcome("b2", "v2", "wrong_output")],
     [("canary", "v2", 2, ("b1", "b2"))]),
    (snapshot(), [outcome("b1", "v2", "wrong_output"), outcome("b2", "v2", "ok")], []),  # one instance, not the version
    (snapshot(), [outcome("b1", "v2", "timeout")], []),  # slow is not wrong
    (snapshot(), [outcome("a1", "v1", "wrong_output")], []),  # prod's version: never
    (snapshot(canary="v1"), [outcome("a1", "v1", "wrong_output")], []),  # canary tracks prod: still prod's
    (snapshot(), [], []),  # nothing answered yet
    (None, [outcome("b1", "v2", "wrong_output")], []),  # no snapshot: no aliases known
])
def test_failed_versions_are_non_prod_aliases_whose_every_answering_instance_was_wrong(snap, outcomes, expected):
    assert [(f.alias, f.version, f.revision, f.instances) for f in failed_versions(snap, outcomes)] == expected


class ScriptedCatalog:
    def __init__(self) -> None:
        self.posts: list[tuple[str, dict]] = []
        self.status = 200

    def transport(self) -> httpx.MockTransport:
        def handler(request: httpx.Request) -> httpx.Response:
            assert request.headers["authorization"] == "Bearer agent-secret"
            self.posts.append((request.url.path, json.loads(request.content)))
            if self.status == 0:
                raise httpx.ConnectError("control plane away")
            return httpx.Response(self.status, json={"version": "v1"} if self.status == 200 else
                                  {"error": {"type": "alias_conflict", "message": "moved"}})
        return httpx.MockTransport(handler)


async def rounds(agent, clock, n: int) -> None:
    for _ in range(n):
        await settle(agent, clock)
        if agent.rollback_reports.task is not None:
            await asyncio.gather(agent.rollback_reports.task, return_exceptions=True)


def build(catalog: ScriptedCatalog, clock: ManualClock):
    fleet = Fleet()
    engines = [{"url": f"http://{i}", "instance_id": i, "version": v, "zone": "z1"}
               for i, v in (("a1", "v1"), ("b1", "v2"), ("b2", "v2"))]
    for engine in engines:
        fleet.engines[engine["instance_id"]] = ScriptedEngine(engine["instance_id"], version=engine["version"])
    agent, _, _ = make_agent(fleet, clock, renew_leases_for=engines, canary_per_instance_per_s=0.5)

    class Snapshots:
        current = snapshot()

    agent.snapshots = Snapshots()  # type: ignore[assignment]
    agent.rollback_reporter = CanaryRollbackReporter(httpx.AsyncClient(transport=catalog.transport()), "http://cp",
                                                     token="agent-secret")
    return agent, fleet, Snapshots


async def test_a_canary_version_wrong_on_every_instance_is_reported_once_per_alias_revision() -> None:
    clock, catalog = ManualClock(), ScriptedCatalog()
    agent, fleet, snapshots = build(catalog, clock)
    await rounds(agent, clock, 4)
    assert catalog.posts == []  # every instance answers as recorded
    fleet.engines["b1"].output = [9, 9, 9]
    await rounds(agent, clock, 8)
    assert catalog.posts == []  # b2 of v2 still passes: one bad instance, not a bad version
    fleet.engines["b2"].output = [9, 9, 9]
    catalog.status = 0  # the control plane away: retried, never dropped
    await rounds(agent, clock, 8)
    assert len(catalog.posts) >= 1 and agent.rollback_outcomes == {}
    catalog.status, catalog.posts = 200, []
    await rounds(agent, clock, 8)
    [(path, body)] = catalog.posts
    assert path == "/api/v1/catalog/models/tiny/aliases/canary/canary-failures"
    assert body["version"] == "v2" and body["expected_revision"] == 2 and body["instances"] == ["b1", "b2"]
    assert body["reason"].startswith("wrong_output: canary: token 0 is 9")
    await rounds(agent, clock, 8)
    assert len(catalog.posts) == 1  # reported: never again for that revision
    assert agent.status()["canary_rollbacks"] == {"tiny:canary@2": "accepted"}
    # The alias moved on (promoted to v2 again, say): a new revision is a new question.
    snapshots.current = snapshot(revision=4)
    catalog.status = 409
    await rounds(agent, clock, 2)
    assert [b["expected_revision"] for _, b in catalog.posts] == [2, 4]
    assert agent.status()["canary_rollbacks"]["tiny:canary@4"] == "refused"
    assert fleet.engines["a1"].canaries > 0  # prod's instance was canaried throughout and never reported


async def test_the_agent_asks_for_nothing_when_canary_rollback_is_off() -> None:
    clock, catalog = ManualClock(), ScriptedCatalog()
    agent, fleet, _ = build(catalog, clock)
    agent.settings = agent.settings.model_copy(update={"canary_rollback": False})
    for name in ("b1", "b2"):
        fleet.engines[name].output = [9, 9, 9]
    await rounds(agent, clock, 10)
    assert catalog.posts == []
