"""One lease contract: written through the gateway's registry, read through the control plane's reader.

Both sides import `contract.lease`; this test holds them to it on the real
Redis at 127.0.0.1:6379, including the case that used to break it: the
control plane showing nothing although engines were registered.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
import redis
import redis.asyncio as aioredis

from contract.lease import LeaseExpired, Registration, RedisLeaseRegistry, StaleGeneration
from contract.sampling import Sampling
from controlplane.topology.lease import RedisLeaseReader

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    prefix = f"test-lease-{uuid.uuid4().hex[:10]}"  # unique: other suites share this Redis
    yield prefix
    client = aioredis.from_url(REDIS_URL)
    keys = [k async for k in client.scan_iter(f"{prefix}:*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


async def test_control_plane_reads_what_the_gateway_registry_writes(prefix: str) -> None:
    gateway_side = RedisLeaseRegistry.from_url(REDIS_URL, region="eu-west", prefix=prefix, ttl=timedelta(seconds=2))
    other_region = RedisLeaseRegistry.from_url(REDIS_URL, region="us-east", prefix=prefix, ttl=timedelta(seconds=2))
    reader = RedisLeaseReader.from_url(REDIS_URL, prefix=prefix)
    try:
        first = await gateway_side.register(Registration("engine-a", "http://127.0.0.1:9001", "tiny-seed0", "eu-west-1a", "eu-west"))
        second = await gateway_side.register(Registration("engine-b", "http://127.0.0.1:9002", "tiny-seed0", "eu-west-1b", "eu-west"))
        await other_region.register(Registration("engine-z", "http://127.0.0.1:9009", "tiny-seed0", "us-east-1a", "us-east"))

        observed = reader.list_instances("eu-west")
        assert observed == [first, second]  # the same record, field for field
        now = time.time()
        assert all(lease.is_live(now) for lease in observed)
        assert [lease.instance_id for lease in reader.list_instances("us-east")] == ["engine-z"]

        renewed = await gateway_side.renew("engine-a", first.generation)
        assert renewed.expires_at >= first.expires_at
        assert reader.list_instances("eu-west")[0] == renewed

        await gateway_side.release("engine-b", second.generation)
        assert [lease.instance_id for lease in reader.list_instances("eu-west")] == ["engine-a"]
    finally:
        await gateway_side.close()
        await other_region.close()
        reader.redis.close()


async def test_generations_only_grow_and_a_lapsed_lease_is_gone_for_every_reader(prefix: str) -> None:
    registry = RedisLeaseRegistry.from_url(REDIS_URL, region="r1", prefix=prefix, ttl=timedelta(milliseconds=300))
    reader = RedisLeaseReader.from_url(REDIS_URL, prefix=prefix)
    reg = Registration("engine-a", "http://127.0.0.1:9", "v", "z1", "r1")
    try:
        first = await registry.register(reg)
        second = await registry.register(reg)  # a restart
        assert second.generation == first.generation + 1
        with pytest.raises(StaleGeneration):
            await registry.renew("engine-a", first.generation)
        await asyncio.sleep(0.5)
        assert reader.list_instances("r1") == []
        with pytest.raises(LeaseExpired):
            await registry.renew("engine-a", second.generation)
        assert (await registry.register(reg)).generation == second.generation + 1
    finally:
        await registry.close()
        reader.redis.close()


async def test_reader_skips_records_not_written_through_the_contract(prefix: str) -> None:
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        client.sadd(f"{prefix}:eu:instances", "junk")
        client.set(f"{prefix}:eu:lease:junk", "not json", px=5000)
        assert RedisLeaseReader(client, prefix=prefix).list_instances("eu") == []
    finally:
        client.close()


async def test_the_sampling_an_engine_declared_reaches_every_reader_and_survives_renewal(prefix: str) -> None:
    """The agent writes what a vLLM answered (contract/sampling.py); gateways and the control plane read it."""
    agent_side = RedisLeaseRegistry.from_url(REDIS_URL, region="eu-west", prefix=prefix, ttl=timedelta(seconds=2))
    gateway_side = RedisLeaseRegistry.from_url(REDIS_URL, region="eu-west", prefix=prefix, ttl=timedelta(seconds=2))
    reader = RedisLeaseReader.from_url(REDIS_URL, prefix=prefix)
    raw = redis.Redis.from_url(REDIS_URL)
    try:
        keyed = await agent_side.register(Registration("vllm-a", "http://127.0.0.1:9001", "tiny", "z1", "eu-west",
                                                       sampling=Sampling.POSITION_KEYED.value))
        plain = await agent_side.register(Registration("vllm-b", "http://127.0.0.1:9002", "tiny", "z2", "eu-west"))
        await agent_side.renew("vllm-a", keyed.generation)
        seen = {lease.instance_id: lease.sampling for lease in await gateway_side.live()}
        assert seen == {"vllm-a": "position_keyed", "vllm-b": "engine_default"}
        assert {lease.instance_id: lease.sampling for lease in reader.list_instances("eu-west")} == seen
        # A record an older writer left (no field) or a kind this reader does not know claims nothing.
        for stored in ("quantum", None):
            record = json.loads(raw.get(f"{prefix}:eu-west:lease:vllm-b"))
            record.pop("sampling", None)
            if stored is not None:
                record["sampling"] = stored
            raw.set(f"{prefix}:eu-west:lease:vllm-b", json.dumps(record), px=2000)
            assert {lease.instance_id: lease.sampling for lease in await gateway_side.live()}["vllm-b"] == \
                "engine_default"
        assert plain.sampling == "engine_default"
    finally:
        await agent_side.close()
        await gateway_side.close()
        reader.redis.close()
        raw.close()
