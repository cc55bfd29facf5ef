"""The Redis lease-registry reader against the real Redis at 127.0.0.1:6379."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from controlplane.topology.lease import RedisLeaseReader, lease_key

pytestmark = pytest.mark.integration

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
def region_in_redis() -> Iterator[tuple[Any, str]]:
    client = redis.Redis.from_url(REDIS_URL)
    region = f"test-{uuid.uuid4().hex[:10]}"  # unique: other suites share this Redis
    yield client, region
    for key in client.scan_iter(match=f"lifeline:lease:{region}:*"):
        client.delete(key)
    client.close()


def test_redis_reader_reads_hash_and_json_records_and_skips_malformed(region_in_redis: tuple[Any, str]) -> None:
    client, region = region_in_redis
    expires = datetime(2030, 1, 1, tzinfo=UTC)
    client.hset(lease_key(region, "engine-a"), mapping={
        "instance_id": "engine-a", "generation": 2, "endpoint": "http://a", "zone": "z1", "state": "ready",
        "lease_expires_at": expires.isoformat(),
    })
    client.set(lease_key(region, "engine-b"), json.dumps({
        "instance_id": "engine-b", "generation": 5, "endpoint": "http://b", "zone": None, "state": "starting",
        "lease_expires_at": (expires + timedelta(seconds=3)).timestamp(),
    }))
    client.set(lease_key(region, "engine-c"), "not json")
    client.hset(lease_key(region, "engine-d"), mapping={"instance_id": "engine-d"})
    client.set(lease_key(region + "x", "engine-z"), "{}")  # another region sharing the prefix
    try:
        instances = RedisLeaseReader(client).list_instances(region)
    finally:
        client.delete(lease_key(region + "x", "engine-z"))
    assert [(i.instance_id, i.generation, i.zone, i.state) for i in instances] == [
        ("engine-a", 2, "z1", "ready"), ("engine-b", 5, None, "starting")]
    assert instances[0].lease_expires_at == expires
    assert instances[1].lease_expires_at == expires + timedelta(seconds=3)
    assert RedisLeaseReader(client).list_instances(f"{region}-empty") == []
