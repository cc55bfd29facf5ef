"""Leases and generations of live engine instances, per region.

An endpoint is `(instance_id, generation)`. Each registration of an instance id
— first boot, restart, or coming back after a lapsed lease — gets a generation
higher than any before it, assigned here, never by the engine. Renewals and
releases name the generation they hold; an older one is rejected
(`StaleGeneration`), so a process that was partitioned away cannot resurrect
its old endpoint. Expiry is computed when read; nothing stores "is dead".

Two implementations behind `LeaseRegistry`: `InMemoryLeaseRegistry` (embedded
default: engines renew against the gateway's authenticated lease endpoint) and
`RedisLeaseRegistry` (production: shared by all gateway replicas of a region,
engines may renew directly). Redis does the compare-and-set in Lua scripts so
two replicas never disagree about who holds which generation.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Protocol

import redis.asyncio as aioredis

from gateway.clock import Clock, MonotonicClock
from gateway.errors import LeaseExpired, StaleGeneration


@dataclass(frozen=True)
class Lease:
    instance_id: str
    generation: int
    url: str
    version: str
    zone: str = "local-a"
    region: str = "local"
    expires_at: float = 0.0  # registry clock; only meaningful in memory

    def public(self) -> dict:
        body = asdict(self)
        body.pop("expires_at")
        return body


@dataclass(frozen=True)
class Registration:
    instance_id: str
    url: str
    version: str
    zone: str = "local-a"
    region: str = "local"


class LeaseRegistry(Protocol):
    ttl: timedelta

    async def register(self, reg: Registration) -> Lease:
        """Start a lease under a new, higher generation; any older one stops being live."""
        ...

    async def renew(self, instance_id: str, generation: int) -> Lease:
        """Extend the lease; StaleGeneration if a newer one exists, LeaseExpired if it lapsed."""
        ...

    async def release(self, instance_id: str, generation: int) -> None:
        """End the lease now (clean shutdown); a stale generation is ignored."""
        ...

    async def live(self) -> list[Lease]: ...

    async def close(self) -> None: ...


class InMemoryLeaseRegistry:
    def __init__(self, ttl: timedelta = timedelta(seconds=2), clock: Clock | None = None) -> None:
        self.ttl = ttl
        self.clock = clock or MonotonicClock()
        self._generations: dict[str, int] = {}
        self._leases: dict[str, Lease] = {}
        self._lock = asyncio.Lock()

    def _expiry(self) -> float:
        return self.clock.now() + self.ttl.total_seconds()

    async def register(self, reg: Registration) -> Lease:
        async with self._lock:
            generation = self._generations.get(reg.instance_id, 0) + 1
            self._generations[reg.instance_id] = generation
            lease = Lease(reg.instance_id, generation, reg.url, reg.version, reg.zone, reg.region, self._expiry())
            self._leases[reg.instance_id] = lease
            return lease

    async def renew(self, instance_id: str, generation: int) -> Lease:
        async with self._lock:
            current = self._generations.get(instance_id, 0)
            if generation < current:
                raise StaleGeneration(f"{instance_id} generation {generation} is older than {current}")
            lease = self._leases.get(instance_id)
            if lease is None or generation != lease.generation or lease.expires_at <= self.clock.now():
                raise LeaseExpired(f"{instance_id} generation {generation} has no live lease; register again")
            renewed = Lease(**{**asdict(lease), "expires_at": self._expiry()})
            self._leases[instance_id] = renewed
            return renewed

    async def release(self, instance_id: str, generation: int) -> None:
        async with self._lock:
            lease = self._leases.get(instance_id)
            if lease is not None and lease.generation == generation:
                del self._leases[instance_id]

    async def live(self) -> list[Lease]:
        now = self.clock.now()
        return [lease for lease in self._leases.values() if lease.expires_at > now]

    async def close(self) -> None:
        return None


# KEYS[1] generation counter, KEYS[2] lease, KEYS[3] index set; ARGV: lease json (no generation), ttl ms, instance
_REGISTER = """
local gen = redis.call('INCR', KEYS[1])
local lease = cjson.decode(ARGV[1])
lease['generation'] = gen
redis.call('SET', KEYS[2], cjson.encode(lease), 'PX', ARGV[2])
redis.call('SADD', KEYS[3], ARGV[3])
return gen
"""
# KEYS[1] generation counter, KEYS[2] lease, KEYS[3] index set; ARGV: generation, ttl ms, instance
_RENEW = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local gen = tonumber(ARGV[1])
if gen < current then return {-1, current} end
local raw = redis.call('GET', KEYS[2])
if not raw then return {-2, current} end
local lease = cjson.decode(raw)
if tonumber(lease['generation']) ~= gen then return {-2, current} end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
redis.call('SADD', KEYS[3], ARGV[3])
return {gen, current}
"""
_RELEASE = """
local raw = redis.call('GET', KEYS[1])
if raw and tonumber(cjson.decode(raw)['generation']) == tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""


class RedisLeaseRegistry:
    """Lease per instance is one key with a PX expiry: Redis computes expiry at read time."""

    def __init__(self, client: aioredis.Redis, *, prefix: str = "lifeline:lease", ttl: timedelta = timedelta(seconds=2)) -> None:
        self.redis = client
        self.prefix = prefix
        self.ttl = ttl
        self._register = client.register_script(_REGISTER)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    @classmethod
    def from_url(cls, url: str, **kwargs: object) -> RedisLeaseRegistry:
        return cls(aioredis.from_url(url, decode_responses=True), **kwargs)  # type: ignore[arg-type]

    def _keys(self, instance_id: str) -> tuple[str, str]:
        return f"{self.prefix}:gen:{instance_id}", f"{self.prefix}:lease:{instance_id}"

    @property
    def _index(self) -> str:
        return f"{self.prefix}:instances"

    def _ttl_ms(self) -> int:
        return int(self.ttl.total_seconds() * 1000)

    async def register(self, reg: Registration) -> Lease:
        gen_key, lease_key = self._keys(reg.instance_id)
        body = json.dumps(asdict(reg))
        generation = int(await self._register(keys=[gen_key, lease_key, self._index], args=[body, self._ttl_ms(), reg.instance_id]))
        return Lease(reg.instance_id, generation, reg.url, reg.version, reg.zone, reg.region)

    async def renew(self, instance_id: str, generation: int) -> Lease:
        gen_key, lease_key = self._keys(instance_id)
        code, current = await self._renew(keys=[gen_key, lease_key, self._index], args=[generation, self._ttl_ms(), instance_id])
        if int(code) == -1:
            raise StaleGeneration(f"{instance_id} generation {generation} is older than {current}")
        if int(code) == -2:
            raise LeaseExpired(f"{instance_id} generation {generation} has no live lease; register again")
        raw = await self.redis.get(lease_key)
        if raw is None:
            raise LeaseExpired(f"{instance_id} lease lapsed during renewal; register again")
        return _lease_from_json(raw)

    async def release(self, instance_id: str, generation: int) -> None:
        _, lease_key = self._keys(instance_id)
        await self._release(keys=[lease_key], args=[generation])

    async def live(self) -> list[Lease]:
        instances = sorted(await self.redis.smembers(self._index))
        if not instances:
            return []
        raws = await self.redis.mget([self._keys(i)[1] for i in instances])
        gone = [i for i, raw in zip(instances, raws, strict=True) if raw is None]
        if gone:
            # Lapsed leases leave the index lazily; the generation counters stay forever.
            await self.redis.srem(self._index, *gone)
        return [_lease_from_json(raw) for raw in raws if raw is not None]

    async def close(self) -> None:
        await self.redis.aclose()


def _lease_from_json(raw: str) -> Lease:
    data = json.loads(raw)
    return Lease(data["instance_id"], int(data["generation"]), data["url"], data["version"], data.get("zone", "local-a"), data.get("region", "local"))
