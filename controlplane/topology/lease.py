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
from controlplane.topology.errors import LeaseRegistryUnavailable

__all__ = ["GuardedLeaseReader", "InMemoryLeaseReader", "LeaseReader", "NoLeaseRegistry", "RedisLeaseReader"]


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


class GuardedLeaseReader:
    """A Redis reader whose failures are a typed 503, never a 500 nor "no instances".

    A region delete must not pass its live-instance guard because the
    registry did not answer, so a failed read raises
    `LeaseRegistryUnavailable` rather than returning an empty list.
    """

    def __init__(self, inner: RedisLeaseReader) -> None:
        self.inner = inner

    def list_instances(self, region: str) -> list[Lease]:
        import redis

        try:
            return self.inner.list_instances(region)
        except redis.RedisError as exc:
            raise LeaseRegistryUnavailable(
                f"the lease registry did not answer ({type(exc).__name__}); retry shortly", retry_after_s=1
            ) from exc
