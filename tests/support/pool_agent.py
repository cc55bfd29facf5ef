"""A regional agent on real engines for e2e tests: the local driver, the real Redis lease registry, this event loop.

The agent runs in the test's event loop so the test can read what it
believes (`agent.instances`, the events it kept). Its ticks stop by an
event, not by a cancel alone: on Python 3.11 `asyncio.wait_for` can swallow
a cancel, and a loop stopped only by `cancel()` can tick forever.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

import httpx

from common.clock import SystemClock
from contract.lease import RedisLeaseRegistry
from contract.snapshot import RoutingSnapshot
from warm_pool.agent import Agent
from warm_pool.driver import LocalDriver, build_driver
from warm_pool.events import EventShipper
from warm_pool.settings import AgentSettings


class AliasSnapshots:
    """The agent's SnapshotClient as far as the pool reads it: one model whose `prod` alias the test moves."""

    def __init__(self, model: str = "tiny", versions: Iterable[str] = ("v1", "v2"),
                 shards: dict[str, str] | None = None) -> None:
        self.model, self.versions, self.shards = model, tuple(versions), shards
        self.current: RoutingSnapshot | None = None

    def point(self, version: str, revision: int) -> None:
        entry = {"fingerprint": "f", "location": f"/catalog/{version}"}
        self.current = RoutingSnapshot.model_validate({"version": revision, "models": {self.model: {
            "aliases": {"prod": {"version": version, "revision": revision}},
            "versions": {v: {"version": v, **entry, **({"shards": self.shards} if self.shards else {})}
                         for v in self.versions}}}})


@dataclass
class PoolLab:
    agent: Agent
    registry: RedisLeaseRegistry
    driver: LocalDriver
    shipper: EventShipper  # `buffer` holds every event the agent emitted (no control plane here)
    http: httpx.AsyncClient  # the agent's own client


@contextlib.asynccontextmanager
async def ticking_agent(settings: AgentSettings, *, snapshots: AliasSnapshots | None = None
                        ) -> AsyncIterator[PoolLab]:
    """The agent ticking for the block's duration; then its ticks stopped, its engines and clients closed."""
    registry = RedisLeaseRegistry.from_url(settings.registry, region=settings.region,
                                           prefix=settings.registry_prefix, ttl=settings.lease_ttl)
    driver = build_driver(settings.region, settings.pool)
    assert isinstance(driver, LocalDriver), "these tests read the local driver's processes"
    shipper = EventShipper(None, None)
    shipper.url = "kept"  # no control plane: keep the events for the test to read
    http = httpx.AsyncClient(timeout=httpx.Timeout(1.5))
    agent = Agent(settings, registry=registry, http=http, clock=SystemClock(), driver=driver, shipper=shipper)
    if snapshots is not None:
        agent.snapshots = snapshots  # type: ignore[assignment]
    stop = asyncio.Event()
    ticking = asyncio.create_task(agent.run_ticks(stop))
    try:
        yield PoolLab(agent, registry, driver, shipper, http)
    finally:
        stop.set()
        ticking.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticking
        await agent.close()
        await registry.close()
        await http.aclose()
