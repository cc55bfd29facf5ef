from __future__ import annotations

from controlplane.errors import Conflict, LifelineError, NotFound


class RegionNotFound(NotFound):
    error_type = "region_not_found"


class ZoneNotFound(NotFound):
    error_type = "zone_not_found"


class ClusterNotFound(NotFound):
    error_type = "cluster_not_found"


class EjectionNotFound(NotFound):
    error_type = "ejection_not_found"


class TopologyExists(Conflict):
    error_type = "already_exists"


class ClusterConflict(Conflict):
    """The cluster changed since the caller read it (compare-and-set lost)."""

    error_type = "cluster_conflict"


class RegionNotEmpty(Conflict):
    """The region still has clusters, ejections or live instances."""

    error_type = "region_not_empty"


class ClusterInService(Conflict):
    """Only a cluster already out of routing (state `ejected`) may be deleted."""

    error_type = "cluster_in_service"


class LeaseRegistryUnavailable(LifelineError):
    """The regions' lease registry (Redis) is down or silent: observed instances are unknown, not absent."""

    status_code = 503
    error_type = "lease_registry_unavailable"
