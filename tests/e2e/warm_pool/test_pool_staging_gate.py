"""A cold pool on real engine processes never loads a staged copy its check found bad, and loads the fixed one.

The `local` driver runs the tiny model from a staged copy (the region's
disk); the snapshot carries the sha256 of every file as the catalog
recorded them (`VersionEntry.shards`). The agent runs in the test's loop
with the real Redis lease registry. One weight shard goes bad on the
staged copy; the check finds it; the serving engine is SIGKILLed: the
backfill is held (no process started, a `pool.start_refused` event, the
report's `held_starts`). The copy is re-synced: checked again, started,
serving.
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
from pathlib import Path

from tests.support.pool_agent import AliasSnapshots, ticking_agent
from tests.support.waiting import until
from warm_pool.settings import AgentSettings
from warm_pool.states import InstanceState

REDIS_URL = "redis://127.0.0.1:6379/0"
REGION = "r-staged"
ONE_ZONE_COLD = {"zones": ["x"], "demand_seqs": 2, "demand_tokens_per_s": 50, "context_tokens": 40,
                 "instance_seqs": 4, "instance_tokens_per_s": 100, "instance_prefill_tokens_per_s": 1000,
                 "recovery_target_s": 5.0, "tier": "cold"}


async def test_a_loss_never_loads_the_corrupted_staged_copy_and_the_re_synced_one_serves(
        tiny_model: Path, tmp_path: Path) -> None:
    staged = Path(shutil.copytree(tiny_model, tmp_path / "region" / "v1"))
    recorded = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in staged.iterdir() if p.is_file()}
    shard = staged / "model-00002-of-00002.safetensors"
    good = shard.read_bytes()
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    settings = AgentSettings(
        region=REGION, registry=REDIS_URL, registry_prefix=prefix, lease_ttl=2.0, probe_interval=0.25,
        probe_timeout=1.5, pool={"model": "tiny", "versions": {"v1": str(staged)},
                                 "state_dir": str(tmp_path / "pool"), "staging_check_every": 1.0,
                                 "plan": ONE_ZONE_COLD})
    snapshots = AliasSnapshots(versions=("v1",), shards=recorded)
    snapshots.point("v1", 1)
    async with ticking_agent(settings, snapshots=snapshots) as lab:
        agent, registry, driver, shipper = lab.agent, lab.registry, lab.driver, lab.shipper

        def serving() -> list[str]:
            return [i.instance_id for i in agent.instances.values() if i.state is InstanceState.SERVING]

        def staging() -> tuple[str, int]:
            [staged_version] = agent.report().staging or [None]
            return (staged_version.outcome, staged_version.held_starts) if staged_version else ("unchecked", 0)

        await until(lambda: serving() and staging() == ("verified", 0), "v1 serves from a verified copy")
        [first] = serving()

        with shard.open("r+b") as file:  # one byte gone bad on the region's disk, in place
            file.seek(len(good) // 2)
            file.write(bytes([good[len(good) // 2] ^ 0xFF]))
        await until(lambda: staging()[0] == "mismatch", "the check finds the corrupted shard")

        driver.processes[first].popen.kill()  # the loss: the pool must replace it from that copy

        def refused() -> list:
            return [e for e in shipper.buffer if e.kind == "pool.start_refused"]

        [event] = await until(refused, "the backfill is refused")
        assert (event.detail["outcome"], event.detail["shard"], event.detail["held"]) == ("mismatch", shard.name, 1)
        assert staging() == ("mismatch", 1)
        assert driver.processes == {} and not agent.instances  # nothing started, nothing loaded the bad bytes
        assert not await registry.live()

        fresh = shard.with_name("resync.partial")  # the operator re-syncs the copy
        fresh.write_bytes(good)
        fresh.replace(shard)
        await until(lambda: serving() and staging() == ("verified", 0), "the fixed copy is checked and serves")
        [second] = serving()
        assert second != first and list(driver.processes) == [second]

        async def leased() -> list[str]:  # the lease follows the promotion on the agent's next renewal
            return [lease.instance_id for lease in await registry.live()]

        assert await until(leased, "the fixed copy's instance holds the lease") == [second]
        assert len(refused()) == 1
