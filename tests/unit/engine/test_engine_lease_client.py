"""The engine's lease client on virtual time: a registry it cannot reach for a TTL means step down, then re-register."""

from __future__ import annotations

import asyncio

from common.clock import ManualClock
from engine.lease_client import LeaseClient, LeaseLost, RegistryUnreachable

TTL = 0.04  # real seconds between renewals stay tiny; lapse decisions read the manual clock


class FakeRegistry:
    """Generations from a counter; while `reachable` is False every call fails and time moves a third of a TTL."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.reachable = True
        self.generation = 0
        self.renewals = 0
        self.log: list[str] = []

    def _call(self, what: str) -> None:
        self.log.append(what if self.reachable else f"{what}-unreachable")
        if not self.reachable:
            self.clock.advance(TTL / 3)
            raise RegistryUnreachable("cut off")
        self.clock.advance(TTL / 10)

    async def register(self) -> tuple[int, float]:
        self._call("register")
        self.generation += 1
        return self.generation, TTL

    async def renew(self, generation: int) -> None:
        self._call("renew")
        if generation != self.generation:
            raise LeaseLost("old generation")
        self.renewals += 1

    async def release(self, generation: int) -> None:
        self._call("release")

    async def close(self) -> None:
        pass


async def _until(predicate, what: str) -> None:
    for _ in range(2000):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never happened: {what}")


def test_unreachable_registry_for_a_ttl_lapses_the_lease_then_registers_a_new_generation() -> None:
    async def scenario() -> list[str]:
        clock = ManualClock()
        registry = FakeRegistry(clock)
        events: list[str] = []
        client = LeaseClient(registry, on_generation=lambda g: events.append(f"generation {g}"),
                             on_lapsed=lambda: events.append("lapsed"), clock=clock)
        client.start()
        await _until(lambda: registry.renewals >= 2, "two renewals")
        assert events == ["generation 1"]
        registry.reachable = False
        await _until(lambda: "lapsed" in events, "the lease lapsing")
        lapsed_after = clock.now() - client.renewed_at
        assert lapsed_after >= TTL
        await _until(lambda: registry.log.count("register-unreachable") >= 2, "registration retried while cut off")
        assert events == ["generation 1", "lapsed"]
        registry.reachable = True
        await _until(lambda: "generation 2" in events, "registration under a new generation")
        await client.stop()
        return events

    assert asyncio.run(scenario()) == ["generation 1", "lapsed", "generation 2"]


def test_one_failed_renewal_within_the_ttl_does_not_lapse() -> None:
    async def scenario() -> list[str]:
        clock = ManualClock()
        registry = FakeRegistry(clock)
        events: list[str] = []
        client = LeaseClient(registry, on_generation=lambda g: events.append(f"generation {g}"),
                             on_lapsed=lambda: events.append("lapsed"), clock=clock)
        client.start()
        await _until(lambda: registry.renewals >= 1, "a renewal")
        registry.reachable = False
        await _until(lambda: "renew-unreachable" in registry.log, "a failed renewal")
        registry.reachable = True
        before = registry.renewals
        await _until(lambda: registry.renewals >= before + 3, "renewals resuming")
        await client.stop()
        return events

    assert asyncio.run(scenario()) == ["generation 1"]
