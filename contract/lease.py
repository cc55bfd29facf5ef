"""Leases and generations of live engine instances: the one record and key layout.

An endpoint is `(instance_id, generation)`. Each registration of an instance id
— first boot, restart, or coming back after a lapsed lease — gets a generation
higher than any before it, assigned by the registry, never by the engine.
Renewals and releases name the generation they hold; an older one is refused
(`StaleGeneration`), so a process that was partitioned away cannot resurrect
its old endpoint.

Who writes and who reads, all through this module:

    engine (or the regional agent for stock vLLM) ──register/renew/release──► registry
    gateway replicas ──live()──► route;   control plane ──RedisLeaseReader──► observed instances

Redis key layout of one region's registry (`prefix` defaults to `lifeline`):

    {prefix}:{region}:gen:{instance_id}     INCR counter; never expires, so generations never go back
    {prefix}:{region}:lease:{instance_id}   the lease record as JSON, with a PX expiry of one TTL
    {prefix}:{region}:instances             SET of instance ids; lapsed members are pruned on read

The record is `LEASE_FIELDS` as JSON, `expires_at` in Unix seconds taken from
Redis's own clock (`TIME`) inside the scripts, so every writer stamps expiry
with one clock. A key that exists is live; readers that cache records compare
`expires_at` with their clock at read time. Nothing stores "is dead".

Behind Sentinel (`redis+sentinel://…`, `common.redis_url`) a failover can lose
the last writes of the old primary (replication is asynchronous). Two rules
keep the contract through that:

- **A generation is handed out only once a replica has it.** After the
  registration script the registry sends `WAIT 1` (by default whenever the
  client follows a Sentinel-watched primary) and returns the generation only
  if a replica acknowledged it; otherwise the registration is released and
  refused (`not_replicated`, 503; the engine registers again). A generation
  lost with the old primary was therefore never given to anyone. WAIT costs
  one replication round trip per registration (once per engine boot or
  lapse), none per renewal; it needs a replica that outlives the primary, so
  run two (`lifeline.daemons.RedisSentinelLab` does).
- **The counter never starts below the clock.** WAIT 1 is not enough alone:
  Sentinel may promote a replica other than the one that acknowledged (one
  that rejoined and has not synced yet — `tests/integration/redis_ha` saw
  `[1, 2, 2]` that way). So behind Sentinel the script hands out
  `max(INCR, Redis TIME in ms)`: a primary that lost the last INCRs still
  starts above them as long as its clock is not behind the old primary's by
  more than the failover took (seconds; NTP keeps hosts within
  milliseconds). Generations are then large, opaque numbers (≈1.8e12), as
  the embedded registry's are; +1 within a millisecond. Rejected: a
  generation prefixed by Sentinel's config epoch (the registry would have to
  learn the epoch of the primary it writes to, racily); a second store for
  counters.
- **Retries know what they re-run.** A registration carries a nonce: the
  script returns the generation it already gave that nonce, so re-sending a
  registration whose answer was lost does not burn a second generation. A
  renewal whose answer was lost (a connection that broke, a timeout) is
  re-read, not assumed: the lease is read back and its own `expires_at`
  returned, or the answer is `StaleGeneration` / `LeaseExpired` from what is
  there now.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import redis
import redis.asyncio as aioredis

from common.errors import LifelineError
from common.logs import get_logger
from common.redis_url import async_redis_client, is_sentinel_client, redis_client
from contract.sampling import Sampling

log = get_logger(__name__)

DEFAULT_PREFIX = "lifeline"


class LeaseError(LifelineError):
    """A lease operation the registry refused."""


class StaleGeneration(LeaseError):
    """A newer generation of this instance id exists: the caller was superseded."""

    status_code = 409
    error_type = "stale_generation"


class NotReplicated(LeaseError):
    """No replica acknowledged the registration in time; it was not handed out. Register again."""

    status_code = 503
    error_type = "not_replicated"


class LeaseExpired(LeaseError):
    """The lease lapsed (or was released): register again under a new generation."""

    status_code = 404
    error_type = "lease_expired"


@dataclass(frozen=True)
class Registration:
    """What an engine declares about itself when it registers.

    `sampling` (`contract.sampling.Sampling`): whether a seeded stream moved to
    this endpoint continues token-identically. The reference engine declares
    `position_keyed`; the agent declares what a vLLM answered when asked.
    """

    instance_id: str
    url: str
    version: str
    zone: str = "local-a"
    region: str = "local"
    sampling: str = Sampling.ENGINE_DEFAULT.value


@dataclass(frozen=True)
class Lease:
    """A live endpoint: the registration, the generation the registry gave it, and when it lapses."""

    instance_id: str
    generation: int
    url: str
    version: str
    zone: str = "local-a"
    region: str = "local"
    expires_at: float = 0.0  # Unix seconds
    sampling: str = Sampling.ENGINE_DEFAULT.value  # a record without it (an older writer) claims nothing

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Lease:
        """Parse a stored record; ValueError (with the reason) if it is not one."""
        try:
            data = json.loads(raw)
            return cls(
                instance_id=str(data["instance_id"]), generation=int(data["generation"]), url=str(data["url"]),
                version=str(data["version"]), zone=str(data["zone"]), region=str(data["region"]),
                expires_at=float(data["expires_at"]), sampling=_sampling(data.get("sampling")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a lease record: {exc!r}") from None

    def public(self) -> dict[str, Any]:
        return asdict(self)

    def expires_at_datetime(self) -> datetime:
        return datetime.fromtimestamp(self.expires_at, UTC)

    def is_live(self, wall_now: float) -> bool:
        return wall_now < self.expires_at


LEASE_FIELDS = tuple(Lease.__dataclass_fields__)


def _sampling(value: Any) -> str:
    """A stored sampling kind; anything unknown claims nothing (a continuation may differ), never identity."""
    try:
        return Sampling(value).value
    except ValueError:
        return Sampling.ENGINE_DEFAULT.value


@dataclass(frozen=True)
class LeaseKeys:
    region: str
    prefix: str = DEFAULT_PREFIX

    def generation(self, instance_id: str) -> str:
        return f"{self.prefix}:{self.region}:gen:{instance_id}"

    def lease(self, instance_id: str) -> str:
        return f"{self.prefix}:{self.region}:lease:{instance_id}"

    @property
    def index(self) -> str:
        return f"{self.prefix}:{self.region}:instances"


class LeaseRegistry(Protocol):
    """One region's registry, as gateways and engines use it (Redis or the gateway's embedded one)."""

    ttl: timedelta

    async def register(self, registration: Registration) -> Lease:
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


_NOW_MS = "local t = redis.call('TIME'); local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"

# KEYS: generation counter, lease, index. ARGV: registration JSON (with a nonce), ttl ms, instance id, nonce,
# '1' to start the counter no lower than Redis's clock in ms (behind Sentinel).
# Re-running it with the same nonce returns the generation already given (a lost answer, resent).
REGISTER_SCRIPT = _NOW_MS + """
local held = redis.call('GET', KEYS[2])
if held then
  local prior = cjson.decode(held)
  if prior['nonce'] == ARGV[4] then return tonumber(prior['generation']) end
end
local gen = redis.call('INCR', KEYS[1])
if ARGV[5] == '1' and gen < now_ms then
  gen = now_ms
  redis.call('SET', KEYS[1], gen)
end
local lease = cjson.decode(ARGV[1])
lease['generation'] = gen
lease['expires_at'] = (now_ms + tonumber(ARGV[2])) / 1000
redis.call('SET', KEYS[2], cjson.encode(lease), 'PX', ARGV[2])
redis.call('SADD', KEYS[3], ARGV[3])
return gen
"""
# KEYS: generation counter, lease, index. ARGV: generation, ttl ms, instance id.
# Returns {code, current generation, record}: code -1 stale, -2 lapsed, else the generation.
RENEW_SCRIPT = _NOW_MS + """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local gen = tonumber(ARGV[1])
if gen < current then return {-1, current, ''} end
local raw = redis.call('GET', KEYS[2])
if not raw then return {-2, current, ''} end
local lease = cjson.decode(raw)
if tonumber(lease['generation']) ~= gen then return {-2, current, ''} end
lease['expires_at'] = (now_ms + tonumber(ARGV[2])) / 1000
local record = cjson.encode(lease)
redis.call('SET', KEYS[2], record, 'PX', ARGV[2])
redis.call('SADD', KEYS[3], ARGV[3])
return {gen, current, record}
"""
# KEYS: lease. ARGV: generation.
RELEASE_SCRIPT = """
local raw = redis.call('GET', KEYS[1])
if raw and tonumber(cjson.decode(raw)['generation']) == tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""


class RedisLeaseRegistry:
    """A region's registry in Redis, shared by every gateway replica and engine of the region.

    The compare-and-set runs in Lua, so two writers never disagree about who
    holds which generation, and Redis's key expiry is the lease's expiry.
    """

    def __init__(self, client: aioredis.Redis, *, region: str, prefix: str = DEFAULT_PREFIX,
                 ttl: timedelta = timedelta(seconds=2), min_replicas: int | None = None, clock_floor: bool | None = None,
                 replication_timeout: timedelta = timedelta(milliseconds=500)) -> None:
        self.redis = client
        self.keys = LeaseKeys(region, prefix)
        self.ttl = ttl
        # None: both guards exactly when a Sentinel-watched primary can fail over (a single Redis keeps 1, 2, 3…).
        failover = is_sentinel_client(client)
        self.min_replicas = (1 if failover else 0) if min_replicas is None else min_replicas
        self.clock_floor = failover if clock_floor is None else clock_floor
        self.replication_timeout_ms = max(1, int(replication_timeout.total_seconds() * 1000))
        self._register = client.register_script(REGISTER_SCRIPT)
        self._renew = client.register_script(RENEW_SCRIPT)
        self._release = client.register_script(RELEASE_SCRIPT)

    @classmethod
    def from_url(cls, url: str, *, region: str, prefix: str = DEFAULT_PREFIX,
                 ttl: timedelta = timedelta(seconds=2)) -> RedisLeaseRegistry:
        return cls(async_redis_client(url), region=region, prefix=prefix, ttl=ttl)

    def _ttl_ms(self) -> int:
        return max(1, int(self.ttl.total_seconds() * 1000))

    async def register(self, registration: Registration) -> Lease:
        if registration.region != self.keys.region:
            raise LeaseError(f"instance {registration.instance_id!r} is in region {registration.region!r}; "
                             f"this registry serves {self.keys.region!r}", type="wrong_region")
        rid = registration.instance_id
        nonce = secrets.token_hex(8)
        body = json.dumps({**asdict(registration), "nonce": nonce})
        keys = [self.keys.generation(rid), self.keys.lease(rid), self.keys.index]
        args = [body, self._ttl_ms(), rid, nonce, "1" if self.clock_floor else "0"]
        try:
            generation = int(await self._register(keys=keys, args=args))
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            # The answer was lost, not necessarily the write: resend once; the nonce makes it the same registration.
            log.warning("lease registration answer lost; resending under the same nonce", instance=rid, error=str(exc)[:200])
            generation = int(await self._register(keys=keys, args=args))
        if self.min_replicas:
            acked = int(await self.redis.execute_command("WAIT", self.min_replicas, self.replication_timeout_ms))
            if acked < self.min_replicas:
                # Handing it out could let a failover give the same generation to someone else.
                await self._release(keys=[self.keys.lease(rid)], args=[generation])
                log.warning("lease registration not replicated; refused", instance=rid, generation=generation,
                            acked=acked, wanted=self.min_replicas)
                raise NotReplicated(f"{rid} generation {generation}: {acked} of {self.min_replicas} replicas "
                                    f"acknowledged within {self.replication_timeout_ms} ms; register again")
        raw = await self.redis.get(self.keys.lease(rid))
        if raw is None:  # lapsed already (a TTL shorter than the round trip)
            raise LeaseExpired(f"{rid} generation {generation} lapsed during registration")
        return Lease.from_json(raw)

    async def renew(self, instance_id: str, generation: int) -> Lease:
        keys = [self.keys.generation(instance_id), self.keys.lease(instance_id), self.keys.index]
        try:
            code, current, record = await self._renew(keys=keys, args=[generation, self._ttl_ms(), instance_id])
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            # It may or may not have applied (the primary may even have changed): read back what is there.
            log.warning("lease renewal answer lost; reading the lease back", instance=instance_id, error=str(exc)[:200])
            return await self._read_back(instance_id, generation, exc)
        if int(code) == -1:
            raise StaleGeneration(f"{instance_id} generation {generation} is older than {current}")
        if int(code) == -2:
            raise LeaseExpired(f"{instance_id} generation {generation} has no live lease; register again")
        return Lease.from_json(record)

    async def _read_back(self, instance_id: str, generation: int, cause: Exception) -> Lease:
        try:
            current, raw = await self.redis.mget([self.keys.generation(instance_id), self.keys.lease(instance_id)])
        except (redis.ConnectionError, redis.TimeoutError):
            raise cause from None  # still unreachable: the caller retries before its lease lapses
        if int(current or 0) > generation:
            raise StaleGeneration(f"{instance_id} generation {generation} is older than {current}")
        lease = Lease.from_json(raw) if raw is not None else None
        if lease is None or lease.generation != generation:
            raise LeaseExpired(f"{instance_id} generation {generation} has no live lease; register again")
        return lease

    async def release(self, instance_id: str, generation: int) -> None:
        await self._release(keys=[self.keys.lease(instance_id)], args=[generation])

    async def live(self) -> list[Lease]:
        instances = sorted(await self.redis.smembers(self.keys.index))
        if not instances:
            return []
        raws = await self.redis.mget([self.keys.lease(i) for i in instances])
        gone = [i for i, raw in zip(instances, raws, strict=True) if raw is None]
        if gone:
            # Lapsed leases leave the index lazily; the generation counters stay forever.
            await self.redis.srem(self.keys.index, *gone)
        return _parse_all(raws)

    async def close(self) -> None:
        await self.redis.aclose()


class RedisLeaseReader:
    """Read-only, synchronous view of the registries, for the control plane (never on the renewal path)."""

    def __init__(self, client: redis.Redis, *, prefix: str = DEFAULT_PREFIX) -> None:
        self.redis = client
        self.prefix = prefix

    @classmethod
    def from_url(cls, url: str, *, prefix: str = DEFAULT_PREFIX) -> RedisLeaseReader:
        return cls(redis_client(url), prefix=prefix)

    def list_instances(self, region: str) -> list[Lease]:
        keys = LeaseKeys(region, self.prefix)
        instances = sorted(self.redis.smembers(keys.index))
        if not instances:
            return []
        return _parse_all(self.redis.mget([keys.lease(i) for i in instances]))


def _parse_all(raws: list[Any]) -> list[Lease]:
    leases = []
    for raw in raws:
        if raw is None:
            continue
        try:
            leases.append(Lease.from_json(raw))
        except ValueError as exc:  # not written through this module: never routed to
            log.warning("lease record malformed", error=str(exc)[:200])
    return sorted(leases, key=lambda lease: lease.instance_id)


def with_expiry(lease: Lease, expires_at: float) -> Lease:
    return replace(lease, expires_at=expires_at)
