"""The engine's side of leases: register, renew before the lease lapses, release on shutdown.

The registry, not the engine, assigns the generation; a registration after a
restart or after a lapsed lease gets a higher one, which the engine then
reports in `/healthz/generation` and `X-Lifeline-Generation`. Renewals go out
every TTL/2 minus up to 10% jitter (so one lost renewal is survivable and a
fleet restarted together does not renew in lockstep). A renewal refused because
the lease lapsed (a partition, a long pause) means register again under a new
generation rather than keep the old one alive; one refused as stale means a
newer process holds this instance id, and this one steps down (not ready).

A registry the engine cannot reach is a partition: every call is bounded
(TTL/3), a failed renewal is retried before the lease would lapse, and once a
whole TTL has passed since the last renewal that reached the registry, the
lease is taken as lapsed (`on_lapsed`: the engine stops taking new requests,
because gateways stopped routing here) and the engine registers again, for a
new generation, as soon as the registry answers. The TTL is counted from when
the last good renewal was *sent*, so the engine steps down no later than the
registry expires the lease.

Transports: `http(s)://gateway` (the gateway's authenticated lease endpoint,
embedded default) or `redis://…` / `redis+sentinel://h1:p1,h2:p2/service`
(the region's Redis registry, shared with every gateway replica; the client
comes from `common.redis_url` and follows a Sentinel failover). Each turns its
own I/O errors into `RegistryUnreachable`; so is a registration no replica
acknowledged (`contract.lease.NotReplicated`): it was not handed out, and the
engine registers again.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol

import httpx
import redis.exceptions
from tenacity import AsyncRetrying, retry_if_exception_type, stop_never, wait_exponential_jitter

from common.clock import Clock, SystemClock
from common.logs import get_logger
from common.redis_url import describe as describe_redis
from contract.lease import (
    DEFAULT_PREFIX,
    LeaseExpired,
    NotReplicated,
    RedisLeaseRegistry,
    Registration,
    StaleGeneration,
)

log = get_logger(__name__)


class LeaseLost(Exception):
    """The registry refused a renewal because the lease lapsed: register again."""


class LeaseSuperseded(Exception):
    """A newer generation of this instance id exists: another process took over; step down."""


class RegistryUnreachable(Exception):
    """The registry could not be reached or did not answer: the lease may lapse meanwhile."""


class LeaseTransport(Protocol):
    async def register(self) -> tuple[int, float]:
        """Returns (generation, ttl seconds)."""
        ...

    async def renew(self, generation: int) -> None: ...

    async def release(self, generation: int) -> None: ...

    async def close(self) -> None: ...

    async def describe(self) -> dict[str, Any]:
        """Which registry this transport reaches (and, for Redis, which server in which role)."""
        ...


class HttpLeaseTransport:
    def __init__(self, base_url: str, token: str | None, registration: dict[str, str]) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers, timeout=httpx.Timeout(1.0, connect=0.5))
        self.registration = registration

    async def register(self) -> tuple[int, float]:
        try:
            response = await self.http.post("/lifeline/v1/leases", json=self.registration)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise RegistryUnreachable(str(exc) or type(exc).__name__) from exc
        body = response.json()
        return int(body["generation"]), float(body["ttl_s"])

    async def renew(self, generation: int) -> None:
        try:
            response = await self.http.put(f"/lifeline/v1/leases/{self.registration['instance_id']}",
                                           json={"generation": generation})
        except httpx.HTTPError as exc:
            raise RegistryUnreachable(str(exc) or type(exc).__name__) from exc
        if response.status_code == 409:
            raise LeaseSuperseded(response.text)
        if response.status_code == 404:
            raise LeaseLost(response.text)
        if response.status_code >= 400:
            raise RegistryUnreachable(f"lease renewal answered {response.status_code}")

    async def release(self, generation: int) -> None:
        try:
            await self.http.delete(f"/lifeline/v1/leases/{self.registration['instance_id']}",
                                   params={"generation": generation})
        except httpx.HTTPError as exc:
            raise RegistryUnreachable(str(exc) or type(exc).__name__) from exc

    async def close(self) -> None:
        await self.http.aclose()

    async def describe(self) -> dict[str, Any]:
        return {"mode": "gateway", "url": str(self.http.base_url)}


class RedisLeaseTransport:
    def __init__(self, url: str, registration: dict[str, str], *, prefix: str = DEFAULT_PREFIX, ttl_s: float = 2.0) -> None:
        self.registration = Registration(**registration)
        self.url = url
        self.registry = RedisLeaseRegistry.from_url(url, region=self.registration.region, prefix=prefix,
                                                    ttl=timedelta(seconds=ttl_s))

    async def register(self) -> tuple[int, float]:
        try:
            lease = await self.registry.register(self.registration)
        except (LeaseExpired, NotReplicated) as exc:  # lapsed during the round trip, or not replicated: try again
            raise RegistryUnreachable(str(exc)) from None
        except redis.exceptions.RedisError as exc:
            raise RegistryUnreachable(str(exc) or type(exc).__name__) from exc
        return lease.generation, self.registry.ttl.total_seconds()

    async def renew(self, generation: int) -> None:
        try:
            await self.registry.renew(self.registration.instance_id, generation)
        except StaleGeneration as exc:
            raise LeaseSuperseded(str(exc)) from None
        except LeaseExpired as exc:
            raise LeaseLost(str(exc)) from None
        except redis.exceptions.RedisError as exc:
            raise RegistryUnreachable(str(exc) or type(exc).__name__) from exc

    async def release(self, generation: int) -> None:
        try:
            await self.registry.release(self.registration.instance_id, generation)
        except redis.exceptions.RedisError as exc:
            raise RegistryUnreachable(str(exc) or type(exc).__name__) from exc

    async def close(self) -> None:
        await self.registry.close()

    async def describe(self) -> dict[str, Any]:
        return await describe_redis(self.registry.redis, self.url)


def transport_for(url: str, token: str | None, registration: dict[str, str]) -> LeaseTransport:
    """`redis://host:port/db?key_prefix=…&ttl_ms=…`, `redis+sentinel://…/service?…` or the gateway's base URL."""
    if url.startswith(("redis://", "rediss://", "redis+sentinel://")):
        from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        prefix = query.pop("key_prefix", DEFAULT_PREFIX)
        ttl_s = float(query.pop("ttl_ms", "2000")) / 1000.0
        clean = urlunsplit(parts._replace(query=urlencode(query)))
        return RedisLeaseTransport(clean, registration, prefix=prefix, ttl_s=ttl_s)
    if url.startswith(("http://", "https://")):
        return HttpLeaseTransport(url, token, registration)
    raise ValueError(f"registry URL must be http(s)://, redis:// or redis+sentinel://, got {url!r}")


# What a bounded registry call can fail with besides the lease answers themselves.
_UNREACHABLE = (RegistryUnreachable, OSError, TimeoutError, ConnectionError)


class LeaseClient:
    def __init__(self, transport: LeaseTransport, *, on_generation: Callable[[int], None],
                 on_lapsed: Callable[[], None] = lambda: None, on_superseded: Callable[[], None] = lambda: None,
                 clock: Clock | None = None) -> None:
        self.transport = transport
        self.on_generation = on_generation
        self.on_lapsed = on_lapsed
        self.on_superseded = on_superseded
        self.clock: Clock = clock or SystemClock()
        self.generation: int | None = None
        self.ttl_s = 2.0
        self.renewed_at = 0.0  # clock.now() when the last renewal (or registration) that succeeded was sent
        self._task: asyncio.Task | None = None
        self._stopped = False

    def _call_timeout(self) -> float:
        return self.ttl_s / 3

    async def _register(self) -> None:
        # The registry may not be up yet, restarting or cut off: keep trying, gently, each try bounded.
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(_UNREACHABLE),
            wait=wait_exponential_jitter(initial=0.1, max=2.0),
            stop=stop_never,
            reraise=True,
        ):
            with attempt:
                sent_at = self.clock.now()
                self.generation, self.ttl_s = await asyncio.wait_for(self.transport.register(), self._call_timeout())
                self.renewed_at = sent_at
        if self.generation is None:
            raise RuntimeError("registration returned no generation")
        self.on_generation(self.generation)
        log.info("lease registered", generation=self.generation, ttl_s=self.ttl_s)

    def _renew_interval(self) -> float:
        return self.ttl_s / 2 - random.uniform(0, self.ttl_s / 10)

    def _lapses_in(self) -> float:
        return self.renewed_at + self.ttl_s - self.clock.now()

    async def _lapse_and_register(self, reason: str, detail: str) -> None:
        log.warning("lease lapsed; not taking new requests until registered again under a new generation",
                    generation=self.generation, reason=reason, detail=detail[:200])
        self.on_lapsed()
        await self._register()

    async def run(self) -> None:
        await self._register()
        delay = self._renew_interval()
        while True:
            await asyncio.sleep(delay)
            delay = self._renew_interval()
            if self.generation is None:
                raise RuntimeError("renewing without a generation")
            if self._lapses_in() <= 0:
                await self._lapse_and_register("registry_unreachable_for_a_ttl", "no renewal reached it for a TTL")
                continue
            sent_at = self.clock.now()
            try:
                # Never wait past the lapse: a renewal still hanging then could not save the lease anyway.
                timeout = min(self._call_timeout(), self._lapses_in())
                await asyncio.wait_for(self.transport.renew(self.generation), timeout)
                self.renewed_at = sent_at
            except LeaseLost as exc:
                await self._lapse_and_register("registry_says_lapsed", str(exc))
            except LeaseSuperseded as exc:
                # Fighting back would make two processes flap one endpoint; the newer one wins.
                log.error("lease superseded by a newer generation; stepping down", generation=self.generation,
                          detail=str(exc)[:200])
                self.generation = None
                self.on_superseded()
                return
            except _UNREACHABLE as exc:
                detail = str(exc) or type(exc).__name__
                if self._lapses_in() <= 0:
                    await self._lapse_and_register("registry_unreachable_for_a_ttl", detail)
                else:
                    log.warning("lease renewal failed; retrying before the lease lapses", error=detail[:200],
                                lapses_in_s=round(self._lapses_in(), 3))
                    delay = min(delay, max(0.05, self._lapses_in()))

    async def registry_details(self) -> dict[str, Any]:
        """For the engine's `/healthz/ready` details: the registry, and for Redis its server and role."""
        return await self.transport.describe()

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="lease-client")

    async def stop(self) -> None:
        """Release the lease so gateways stop routing here at once, not a TTL later. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: S110 - shutting down either way
                pass
        if self.generation is not None:
            try:
                await asyncio.wait_for(self.transport.release(self.generation), self._call_timeout())
                log.info("lease released", generation=self.generation)
            except Exception as exc:  # the lease lapses within its TTL anyway
                log.warning("lease release failed", error=str(exc)[:200])
        await self.transport.close()
