"""Every Redis client of Lifeline follows a Sentinel failover, and generations stay monotonic through one.

Real processes: a primary, a replica and three sentinels (`RedisSentinelLab`);
the primary is SIGKILLed, never asked to leave.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
import redis

from common.redis_url import async_redis_client, describe, parse_redis_url, redis_client
from contract.lease import NotReplicated, RedisLeaseReader, RedisLeaseRegistry, Registration
from engine.lease_client import RedisLeaseTransport, RegistryUnreachable, transport_for
from lifeline.daemons import RedisSentinelLab

REG = Registration("engine-a", "http://127.0.0.1:9001", "tiny-seed0", "local-a", "local")


async def _until(call, *, within: float = 30.0, pause: float = 0.05):
    """Call until it stops raising a connection error (a failover in progress) or a refusal for want of
    a replica's acknowledgement (as an engine retries both); bounded, never a hang."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            return await call()
        except (redis.ConnectionError, redis.TimeoutError, NotReplicated, RegistryUnreachable):
            await asyncio.sleep(pause)
    return await call()


def test_sentinel_urls_parse_and_bad_ones_name_the_problem() -> None:
    target = parse_redis_url("redis+sentinel://:s3cret@10.0.0.1:26379,10.0.0.2:26380/lifeline?db=2&socket_timeout=0.5")
    assert target.kind == "sentinel"
    assert target.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26380))
    assert (target.service, target.db, target.password, target.options) == ("lifeline", 2, "s3cret", {"socket_timeout": 0.5})
    assert "s3cret" not in target.redacted()
    assert parse_redis_url("redis://127.0.0.1:6379/0").kind == "redis"
    for bad, why in [("redis+sentinel://127.0.0.1:1/", "service"), ("redis+sentinel:///svc", "sentinel"),
                     ("redis+sentinel://h:x/svc", "host:port"), ("http://x", "must be"),
                     ("redis+sentinel://h:1/svc?db=x", "db")]:
        with pytest.raises(ValueError, match=why):
            parse_redis_url(bad)


async def test_registry_follows_a_primary_sigkill_without_restart(lab: RedisSentinelLab) -> None:
    registry = RedisLeaseRegistry.from_url(lab.url, region="local", ttl=timedelta(seconds=2))
    reader = RedisLeaseReader.from_url(lab.url)
    try:
        first = await _until(lambda: registry.register(REG))
        old = lab.primary_port()
        assert (await describe(registry.redis, lab.url))["address"] == f"127.0.0.1:{old}"
        lab.node(old).kill()

        after = await _until(lambda: registry.register(REG))  # the same client object, no restart
        new = lab.wait_for_failover(old)
        details = await describe(registry.redis, lab.url)
        assert (details["address"], details["role"]) == (f"127.0.0.1:{new}", "master")
        assert after.generation > first.generation
        assert [lease.generation for lease in reader.list_instances("local")] == [after.generation]
        renewed = await registry.renew("engine-a", after.generation)
        assert renewed.generation == after.generation
    finally:
        reader.redis.close()
        await registry.close()


async def test_generation_given_just_before_the_primary_dies_is_never_given_again(lab: RedisSentinelLab) -> None:
    """Kill the primary right after each registration; every generation handed out is new.

    The killed primary comes back as a replica; once it was promoted before it had synced, and without
    the clock floor this handed out [1, 2, 2]."""
    registry = RedisLeaseRegistry.from_url(lab.url, region="local", ttl=timedelta(seconds=2))
    handed_out = []
    try:
        for _ in range(2):
            handed_out.append((await _until(lambda: registry.register(REG))).generation)
            old = lab.primary_port()
            lab.node(old).kill()
            lab.wait_for_failover(old)
            lab.node(old).start()  # Sentinel turns it into a replica of the new primary
        handed_out.append((await _until(lambda: registry.register(REG))).generation)
    finally:
        await registry.close()
    assert handed_out == sorted(set(handed_out)) and len(handed_out) == 3


async def _lose_replication(lab: RedisSentinelLab) -> tuple[int, list[int]]:
    """Cut the replicas off (SIGSTOP, links killed) so that the next writes exist only on the primary."""
    old, replicas = lab.primary_port(), lab.replicas()
    for replica in replicas:
        replica.pause()
    admin = redis.Redis(port=old, socket_timeout=1)
    admin.execute_command("CLIENT", "KILL", "TYPE", "replica")
    admin.close()
    return old, [r.port for r in replicas]


def _fail_over_to_a_replica_without_them(lab: RedisSentinelLab, old: int, replica_ports: list[int]) -> int:
    lab.node(old).kill()
    for port in replica_ports:
        lab.node(port).resume()
    new = lab.wait_for_failover(old)
    assert new in replica_ports
    return new


async def test_registration_no_replica_acknowledged_is_refused_and_its_generation_never_reappears(
        lab: RedisSentinelLab) -> None:
    registry = RedisLeaseRegistry.from_url(lab.url, region="local", ttl=timedelta(seconds=2))
    try:
        first = await _until(lambda: registry.register(REG))
        old, replica_ports = await _lose_replication(lab)
        with pytest.raises(NotReplicated):
            await registry.register(REG)  # generation first+1 exists only on the primary: not handed out
        _fail_over_to_a_replica_without_them(lab, old, replica_ports)
        again = await _until(lambda: registry.register(REG))
    finally:
        await registry.close()
    assert again.generation > first.generation  # never one that was handed out before


async def test_without_wait_a_failover_hands_a_generation_out_twice(lab: RedisSentinelLab) -> None:
    """The hazard both guards close (no WAIT, no clock floor, as on a single Redis): why they exist."""
    registry = RedisLeaseRegistry(async_redis_client(lab.url), region="local", ttl=timedelta(seconds=2), min_replicas=0,
                                  clock_floor=False)
    try:
        first = await _until(lambda: registry.register(REG))
        old, replica_ports = await _lose_replication(lab)
        lost = await _until(lambda: registry.register(REG))
        _fail_over_to_a_replica_without_them(lab, old, replica_ports)
        again = await _until(lambda: registry.register(REG))
    finally:
        await registry.close()
    # A generation already handed out comes back: `lost`'s, or `first`'s too when even
    # that write had not reached the replica yet (replication is asynchronous).
    assert again.generation in (first.generation, lost.generation)


async def test_renewal_whose_answer_was_lost_is_read_back(lab: RedisSentinelLab) -> None:
    registry = RedisLeaseRegistry.from_url(lab.url, region="local", ttl=timedelta(seconds=2))
    lease = await _until(lambda: registry.register(REG))
    renew_script = registry._renew

    async def applied_then_lost(**kwargs):
        await renew_script(**kwargs)
        raise redis.ConnectionError("connection reset after the script ran")

    registry._renew = applied_then_lost  # type: ignore[assignment]
    try:
        await asyncio.sleep(0.3)
        renewed = await registry.renew("engine-a", lease.generation)
        stored = await registry.redis.get(registry.keys.lease("engine-a"))
    finally:
        await registry.close()
    assert renewed.generation == lease.generation
    assert renewed.expires_at > lease.expires_at  # what the store holds, not what was assumed
    assert renewed.to_json() == stored or renewed.expires_at == float(__import__("json").loads(stored)["expires_at"])


async def test_engine_transport_and_control_plane_reader_follow_the_failover(lab: RedisSentinelLab) -> None:
    transport = transport_for(f"{lab.url}&key_prefix=ha&ttl_ms=2000", None,
                              {"instance_id": "engine-b", "url": "http://127.0.0.1:9002", "version": "tiny-seed0",
                               "zone": "local-a", "region": "local"})
    assert isinstance(transport, RedisLeaseTransport)
    sync = redis_client(lab.url)
    reader = RedisLeaseReader(sync, prefix="ha")
    try:
        generation, _ = await _until(transport.register)  # WAIT 1 may miss 500 ms on a loaded machine
        old = lab.primary_port()
        lab.node(old).kill()
        started = time.monotonic()
        while True:
            try:
                generation2, _ = await transport.register()
                break
            except Exception:  # noqa: BLE001 - RegistryUnreachable during the failover
                assert time.monotonic() - started < 30, "the transport never reached the new primary"
                await asyncio.sleep(0.05)
        assert generation2 > generation
        details = await transport.describe()  # what the engine's readiness can report
        assert (details["mode"], details["role"]) == ("sentinel", "master")
        assert details["address"] == f"127.0.0.1:{lab.primary_port()}" != f"127.0.0.1:{old}"
        assert [lease.generation for lease in reader.list_instances("local")] == [generation2]
    finally:
        sync.close()
        await transport.close()
