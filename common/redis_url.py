"""One way to turn a Redis URL into a client: a single server or a Sentinel-watched primary.

    redis://[:password@]host:port/db                      one server (tests, the embedded case)
    redis+sentinel://[:password@]h1:p1,h2:p2/service?db=N  ask the sentinels who the primary of `service` is

Every Redis client in Lifeline (the lease registry, the token log, the engine's
lease transport, the control plane's lease reader) is built here, so all of
them follow a Sentinel failover the same way, without a restart: a connection
that breaks (primary SIGKILLed) or answers READONLY (an old primary demoted)
is dropped, and the next connection asks the sentinels for the primary again
(redis-py's `Sentinel.master_for`, which does exactly this; we add nothing to
its discovery).

Two choices made for every client, because the defaults hide faults:

- **Bounded calls.** `socket_timeout` and `socket_connect_timeout` default to
  1 s (overridable in the URL's query), for the servers and for the
  sentinels. A Redis paused with SIGSTOP accepts TCP connections and never
  answers; without a read timeout a call hangs forever.
- **No blind retries in the library.** redis-py retries a failed command three
  times by default; a retried `EVALSHA` of a non-idempotent script (a
  registration's `INCR`) could apply twice. Retries are done by the callers,
  which know whether a command is safe to re-run (`contract.lease`,
  `gateway.token_log_buffered`).

`describe()` says which server a client talks to and in which role, for
`/healthz/ready`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as aiosentinel
from redis import sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

SENTINEL_SCHEME = "redis+sentinel"
DEFAULT_TIMEOUT_S = 1.0
_FLOAT_OPTIONS = ("socket_timeout", "socket_connect_timeout")


@dataclass(frozen=True)
class RedisTarget:
    """A parsed Redis URL: what to connect to, never the password in `str()`."""

    kind: Literal["redis", "sentinel"]
    url: str  # for redis://: the URL as given (redis-py parses it); for sentinels: the original
    sentinels: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    password: str | None = None
    username: str | None = None
    options: dict[str, float] = field(default_factory=dict)

    def redacted(self) -> str:
        parts = urlsplit(self.url)
        if parts.password is None:
            return self.url
        host = parts.netloc.rsplit("@", 1)[1]
        return parts._replace(netloc=f"{parts.username or ''}:***@{host}").geturl()


def parse_redis_url(url: str) -> RedisTarget:
    """Parse `redis://`, `rediss://` or `redis+sentinel://`; ValueError naming what is wrong."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    options = {}
    for name in _FLOAT_OPTIONS:
        if name in query:
            try:
                options[name] = float(query.pop(name))
            except ValueError:
                raise ValueError(f"{url!r}: {name} must be a number of seconds") from None
    if parts.scheme in ("redis", "rediss", "unix"):
        return RedisTarget("redis", url, options=options)
    if parts.scheme != SENTINEL_SCHEME:
        raise ValueError(f"Redis URL must be redis://, rediss:// or {SENTINEL_SCHEME}://, got {url!r}")
    netloc = parts.netloc
    username = password = None
    if "@" in netloc:
        userinfo, netloc = netloc.rsplit("@", 1)
        user, _, pw = userinfo.partition(":")
        username, password = (unquote(user) or None), (unquote(pw) or None)
    sentinels = []
    for hostport in filter(None, netloc.split(",")):
        host, _, port = hostport.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{url!r}: sentinel address {hostport!r} must be host:port")
        sentinels.append((host, int(port)))
    if not sentinels:
        raise ValueError(f"{url!r}: name at least one sentinel host:port")
    service = parts.path.strip("/")
    if not service or "/" in service:
        raise ValueError(f"{url!r}: the path must be the Sentinel service name (…/mymaster?db=0)")
    db = query.pop("db", "0")
    if not db.isdigit():
        raise ValueError(f"{url!r}: db must be a number")
    return RedisTarget("sentinel", url, tuple(sentinels), service, int(db), password, username, options)


def _common_kwargs(target: RedisTarget, decode_responses: bool, *, asyncio: bool = False) -> dict[str, Any]:
    # No retry inside redis-py: callers decide (a lease renewal must fail fast). An asyncio client takes
    # redis.asyncio's Retry (redis-py 8 warns on, and converts, the synchronous one).
    return {
        "decode_responses": decode_responses,
        "socket_timeout": target.options.get("socket_timeout", DEFAULT_TIMEOUT_S),
        "socket_connect_timeout": target.options.get("socket_connect_timeout", DEFAULT_TIMEOUT_S),
        "retry": (AsyncRetry if asyncio else Retry)(NoBackoff(), 0),
    }


def redis_client(url: str, *, decode_responses: bool = True) -> redis.Redis:
    """A synchronous client for `url` (the control plane's lease reader)."""
    target = parse_redis_url(url)
    kwargs = _common_kwargs(target, decode_responses)
    if target.kind == "redis":
        return redis.Redis.from_url(_without_options(url) if target.options else url, **kwargs)
    watcher = sentinel.Sentinel(list(target.sentinels), sentinel_kwargs=_sentinel_kwargs(kwargs), **kwargs)
    return watcher.master_for(target.service, db=target.db, password=target.password, username=target.username)


def async_redis_client(url: str, *, decode_responses: bool = True) -> aioredis.Redis:
    """An asyncio client for `url` (gateway registry and token log, engine lease transport)."""
    target = parse_redis_url(url)
    kwargs = _common_kwargs(target, decode_responses, asyncio=True)
    if target.kind == "redis":
        return aioredis.Redis.from_url(_without_options(url) if target.options else url, **kwargs)
    watcher = aiosentinel.Sentinel(list(target.sentinels), sentinel_kwargs=_sentinel_kwargs(kwargs), **kwargs)
    return watcher.master_for(target.service, db=target.db, password=target.password, username=target.username)


def _sentinel_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    # Sentinels get the same bounds: a paused sentinel must not hold discovery forever.
    return {k: kwargs[k] for k in ("socket_timeout", "socket_connect_timeout")}


def _without_options(url: str) -> str:
    parts = urlsplit(url)
    kept = [(k, v) for k, v in parse_qsl(parts.query) if k not in _FLOAT_OPTIONS]
    return parts._replace(query="&".join(f"{k}={v}" for k, v in kept)).geturl()


def is_sentinel_client(client: Any) -> bool:
    pool = getattr(client, "connection_pool", None)
    return isinstance(pool, (aiosentinel.SentinelConnectionPool, sentinel.SentinelConnectionPool))


async def describe(client: aioredis.Redis, url: str | None = None) -> dict[str, Any]:
    """Which server `client` reaches and its role, for readiness details; never raises."""
    info: dict[str, Any] = {"url": parse_redis_url(url).redacted() if url else None,
                            "mode": "sentinel" if is_sentinel_client(client) else "single"}
    try:
        pool = client.connection_pool
        if is_sentinel_client(client):
            host, port = await pool.get_master_address()  # type: ignore[attr-defined]
            info["service"] = pool.service_name  # type: ignore[attr-defined]
        else:
            kwargs = pool.connection_kwargs
            host, port = kwargs.get("host", "?"), kwargs.get("port", "?")
        info["address"] = f"{host}:{port}"
        role = await client.execute_command("ROLE")
        info["role"] = role[0] if isinstance(role, (list, tuple)) and role else str(role)
        info["reachable"] = True
    except Exception as exc:  # noqa: BLE001 - a readiness probe must answer even when Redis does not
        info["reachable"] = False
        info["error"] = (str(exc) or type(exc).__name__)[:200]
    return info
