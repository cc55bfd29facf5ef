"""SnapshotLeaseView keeps its filtered leases only while the leases and the snapshot table it filtered are the same."""

from __future__ import annotations

from datetime import timedelta
from types import MappingProxyType

from common.clock import ManualClock
from contract.lease import Registration
from contract.snapshot import EjectionEntry, RoutingSnapshot
from gateway.lease_registry import InMemoryLeaseRegistry
from gateway.router import LeaseView
from gateway.snapshot_table import SnapshotLeaseView, SnapshotRouting, SnapshotTable


def table(*ejected: str) -> SnapshotTable:
    snapshot = RoutingSnapshot(version=len(ejected) + 1, ejections=[
        EjectionEntry(region="r1", instance_id=i, generation=None, reason="test") for i in ejected])
    empty = MappingProxyType({})
    return SnapshotTable("r1", snapshot, None, empty, (), empty, empty, empty)


async def test_a_new_snapshot_or_a_new_lease_read_is_filtered_again() -> None:
    registry = InMemoryLeaseRegistry(timedelta(seconds=2), ManualClock())
    for name in ("e0", "e1"):
        await registry.register(Registration(name, f"http://{name}", "v", "r1-a", "r1"))
    inner = LeaseView(registry, refresh_interval=1.0, cached=True)
    await inner.refresh()
    routing = SnapshotRouting("r1")
    routing.apply(table())
    view = SnapshotLeaseView(inner, routing)
    assert [lease.instance_id for lease in await view.current()] == ["e0", "e1"]
    assert await view.current() is await view.current()  # unchanged: filtered once

    routing.apply(table("e1"))
    assert [lease.instance_id for lease in await view.current()] == ["e0"]

    await registry.register(Registration("e2", "http://e2", "v", "r1-a", "r1"))
    await inner.refresh()
    assert [lease.instance_id for lease in await view.current()] == ["e0", "e2"]
