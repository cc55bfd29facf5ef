"""A promotion and a rollback on real engine processes: the previous version waits warm, a rollback loads nothing.

The agent runs in the test's loop with the real `local` driver and the real
Redis lease registry; its snapshot is set by the test (the alias `prod` of
model `tiny`). Two versions of the same weights (two served names) stand
for two weight versions. Promoting v2 starts v2, leases it, keeps v1's
lease for the grace (old_generation: established sessions finish), then
demotes v1 to warm: the plan's previous-version share. Rolling back to v1
leases that same process again — same pid, nothing started for v1 — and
v2 becomes the warm previous version in turn.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from tests.support.pool_agent import AliasSnapshots, ticking_agent
from tests.support.waiting import until
from warm_pool.settings import AgentSettings
from warm_pool.states import InstanceState

REDIS_URL = "redis://127.0.0.1:6379/0"
REGION = "r-roll"


async def test_rollback_after_a_promotion_leases_the_warm_previous_version_and_loads_nothing(
        tiny_model: Path, tmp_path: Path) -> None:
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    settings = AgentSettings(
        region=REGION, registry=REDIS_URL, registry_prefix=prefix, lease_ttl=2.0, probe_interval=0.25,
        probe_timeout=1.5, pool={"model": "tiny", "versions": {"v1": str(tiny_model), "v2": str(tiny_model)},
                                 "state_dir": str(tmp_path / "pool"), "old_generation_grace": 1.0,
                                 "zones": {"z1": {"serving": 1, "warm": 0, "warm_previous": 1}}})
    snapshots = AliasSnapshots()
    snapshots.point("v1", 1)
    async with ticking_agent(settings, snapshots=snapshots) as lab:
        agent, registry, driver, shipper, http = lab.agent, lab.registry, lab.driver, lab.shipper, lab.http

        async def leased() -> dict[str, str]:
            return {lease.instance_id: lease.version for lease in await registry.live()}

        def of(version: str, state: InstanceState) -> list[str]:
            return [i.instance_id for i in agent.instances.values() if i.version == version and i.state is state]

        async def serving(version: str) -> bool:
            return len(of(version, InstanceState.SERVING)) == 1 and list((await leased()).values()) == [version]

        await until(lambda: serving("v1"), "v1 serves")
        [first] = of("v1", InstanceState.SERVING)
        first_pid = driver.pid(first)

        snapshots.point("v2", 2)  # promote

        async def rolled() -> bool:
            return await serving("v2") and of("v1", InstanceState.WARM) == [first]

        await until(rolled, "v2 serves; v1 waits warm as the previous version")
        assert driver.pid(first) == first_pid  # demoted in place, not restarted
        demoted = [e for e in shipper.buffer if e.kind == "pool.demoted"]
        assert [(e.instance_id, e.routing_tier, e.detail["changes_routing"]) for e in demoted] == [(first, "l7", True)]
        [second] = of("v2", InstanceState.SERVING)
        started = len(driver.processes)

        snapshots.point("v1", 3)  # roll back
        await until(lambda: serving("v1"), "v1 serves again")
        assert of("v1", InstanceState.SERVING) == [first] and driver.pid(first) == first_pid
        assert not any(p.instance.version == "v1" for p in list(driver.processes.values())[started:])  # loaded nothing
        answer = (await http.post(f"{agent.instances[first].url}/v1/completions", timeout=60, json={
            "model": "v1", "prompt": "rolled back", "max_tokens": 2, "temperature": 0.0})).json()
        assert answer["model"] == "v1" and answer["choices"][0]["text"] is not None

        async def v2_previous() -> bool:
            return of("v2", InstanceState.WARM) == [second] and list((await leased()).values()) == ["v1"]

        await until(v2_previous, "v2 waits warm as the previous version now")
