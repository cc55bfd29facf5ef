"""Observed instances: the control plane reads the regions' lease registries.

Read-only and never on the renewal path. The record, the key layout and the
Redis reader are `contract.lease`'s, the same ones the gateway's registry and
the engines write, so what `GET /api/v1/regions/{r}/instances` shows is what
gateways route to. Liveness is computed at read time from `expires_at` and
the injected clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from contract.lease import Lease, RedisLeaseReader

__all__ = ["InMemoryLeaseReader", "LeaseReader", "NoLeaseRegistry", "RedisLeaseReader"]


class LeaseReader(Protocol):
    def list_instances(self, region: str) -> list[Lease]: ...


class InMemoryLeaseReader:
    """For tests: leases put here by hand, by their own region."""

    def __init__(self, leases: Iterable[Lease] = ()) -> None:
        self._by_region: dict[str, dict[str, Lease]] = {}
        for lease in leases:
            self.put(lease)

    def put(self, lease: Lease) -> None:
        self._by_region.setdefault(lease.region, {})[lease.instance_id] = lease

    def list_instances(self, region: str) -> list[Lease]:
        return sorted(self._by_region.get(region, {}).values(), key=lambda lease: lease.instance_id)


class NoLeaseRegistry:
    """No registry configured: every region observes nothing."""

    def list_instances(self, region: str) -> list[Lease]:
        return []
