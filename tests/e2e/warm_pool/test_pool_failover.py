"""The warm pool on real engine processes: SIGKILL the serving one; the warm one in the other zone takes over.

The agent runs in the test's event loop (so the test can read what it
believes) with the real `local` driver (`lifeline engine serve` processes)
and the real Redis lease registry. The plan is one serving instance in z1
and one warm in z2; killing z1's serving instance must leave it unroutable
(its lease released, well within one TTL), promote z2's warm instance with
a lease (a routing change, not a load), backfill z1, and once z1 is warm
give it back its serving share (z2's instance drains and is backfilled).
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest

from tests.support.pool_agent import ticking_agent
from tests.support.waiting import until
from warm_pool.settings import AgentSettings
from warm_pool.states import InstanceState

pytestmark = pytest.mark.long  # scheduled first in its tier (tests/conftest.py)

REDIS_URL = "redis://127.0.0.1:6379/0"
REGION = "r-pool"


async def test_sigkill_serving_instance_promotes_warm_from_other_zone_and_backfills(
        tiny_model: Path, tmp_path: Path) -> None:
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    settings = AgentSettings(
        region=REGION, registry=REDIS_URL, registry_prefix=prefix, lease_ttl=2.0, probe_interval=0.5,
        probe_timeout=1.5, pool={"model": "tiny", "versions": {tiny_model.name: str(tiny_model)},
                                 "state_dir": str(tmp_path / "pool"),
                                 "zones": {"z1": {"serving": 1, "warm": 0}, "z2": {"serving": 0, "warm": 1}}})
    async with ticking_agent(settings) as lab:
        agent, registry, driver, shipper = lab.agent, lab.registry, lab.driver, lab.shipper

        def in_state(state: InstanceState, zone: str | None = None) -> list[str]:
            return [i.instance_id for i in agent.instances.values()
                    if i.state is state and zone in (None, i.zone)]

        async def leased() -> set[str]:
            return {lease.instance_id for lease in await registry.live()}

        async def layout() -> bool:  # the plan's: z1 serves (its lease written), z2 waits warm and unleased
            serving, warm = in_state(InstanceState.SERVING, "z1"), in_state(InstanceState.WARM, "z2")
            return len(serving) == 1 and len(warm) == 1 and await leased() == set(serving)

        await until(layout, "z1 serving and leased, z2 warm and not routable")
        [victim] = in_state(InstanceState.SERVING, "z1")
        [standby] = in_state(InstanceState.WARM, "z2")

        os.kill(driver.pid(victim), signal.SIGKILL)

        async def taken_over() -> bool:
            return await leased() == {standby}

        await until(taken_over, "the warm instance in z2 holds the only lease", timeout=30)
        assert agent.instances[standby].state is InstanceState.SERVING
        kinds = [(e.kind, e.instance_id) for e in shipper.buffer]
        assert ("pool.lost", victim) in kinds and ("pool.promoted", standby) in kinds
        promoted = next(e for e in shipper.buffer if e.kind == "pool.promoted" and e.instance_id == standby)
        assert promoted.routing_tier == "l7" and promoted.generation is not None

        async def restored() -> bool:  # z1 backfilled and serving its share; z2's instance retired, z2 backfilled
            serving = in_state(InstanceState.SERVING, "z1")
            return bool(serving and victim not in serving and in_state(InstanceState.WARM, "z2")
                        and standby not in agent.instances and await leased() == set(serving))

        await until(restored, "z1 backfilled and serving, z2 warm again")
        assert any(e.kind == "pool.stopped" and e.instance_id == standby for e in shipper.buffer)
