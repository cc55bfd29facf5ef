from __future__ import annotations

from controlplane.errors import Conflict, NotFound


class RegionNotFound(NotFound):
    default_type = "region_not_found"


class ZoneNotFound(NotFound):
    default_type = "zone_not_found"


class ClusterNotFound(NotFound):
    default_type = "cluster_not_found"


class EjectionNotFound(NotFound):
    default_type = "ejection_not_found"


class TopologyExists(Conflict):
    default_type = "already_exists"


class ClusterConflict(Conflict):
    """The cluster changed since the caller read it (compare-and-set lost)."""

    default_type = "cluster_conflict"
