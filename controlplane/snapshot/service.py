"""Build the snapshot gateways route by, and advance its version.

Any change to desired routing state (alias moves, cluster create/update,
drains, ejections and readmissions) or to what it shows about a version
(a known issue opened or resolved) calls `bump` in the same transaction,
so the version a gateway sees only grows and changes exactly when the
content can have changed. `build` reads the counter *first*: content read
afterwards can only be as new or newer than the version it is labelled
with, so a gateway never caches stale content under a newer ETag.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from common.clock import Clock
from controlplane.snapshot.models import SnapshotCounter
from controlplane.topology.models import ClusterState, InstanceEjection, ServingCluster


def bump(session: Session, *, clock: Clock) -> int:
    session.execute(
        update(SnapshotCounter)
        .where(SnapshotCounter.id == 1)
        .values(version=SnapshotCounter.version + 1, changed_at=clock.utcnow())
    )
    return current_version(session)


def current_version(session: Session) -> int:
    return session.scalar(select(SnapshotCounter.version).where(SnapshotCounter.id == 1)) or 0


def etag_for(version: int) -> str:
    return f'"snapshot-{version}"'


def build(session: Session) -> dict[str, Any]:
    from weight_catalog import repository as catalog_repository

    counter = session.get(SnapshotCounter, 1)
    version = counter.version if counter else 0
    changed_at = counter.changed_at.isoformat() if counter and counter.changed_at else None

    models: dict[str, Any] = {}
    aliased = catalog_repository.aliases_with_versions(session)
    open_issues = catalog_repository.open_issues_by_version(session, {v.id for _, v in aliased})
    for alias, weight_version in aliased:
        model = models.setdefault(alias.model, {"aliases": {}, "versions": {}})
        model["aliases"][alias.name] = {"version": weight_version.version, "revision": alias.revision}
        model["versions"][weight_version.version] = {
            "fingerprint": weight_version.fingerprint,
            "location": weight_version.location,
            # Open issues only, so a gateway or operator sees what is wrong
            # with what it routes to; resolved ones stay in the catalog.
            "known_issues": [
                {"id": issue.id, "severity": issue.severity, "summary": issue.title}
                for issue in open_issues.get(weight_version.id, [])
            ],
        }

    clusters = session.scalars(select(ServingCluster).order_by(ServingCluster.name)).all()
    tier_weights: dict[str, dict[str, dict[str, int]]] = {}
    for cluster in clusters:
        routable = cluster.state == ClusterState.ACTIVE
        by_region = tier_weights.setdefault(cluster.model, {}).setdefault(cluster.region, {})
        zone = cluster.zone or "*"
        by_region[zone] = by_region.get(zone, 0) + (cluster.weight if routable else 0)
        models.setdefault(cluster.model, {"aliases": {}, "versions": {}})

    ejections = session.scalars(
        select(InstanceEjection).order_by(InstanceEjection.region, InstanceEjection.instance_id)
    ).all()
    return {
        "version": version,
        "changed_at": changed_at,
        "models": models,
        "clusters": [
            {
                "name": c.name,
                "region": c.region,
                "zone": c.zone,
                "model": c.model,
                "endpoint": c.endpoint,
                "weight": c.weight,
                "state": c.state,
            }
            for c in clusters
        ],
        "tier_weights": tier_weights,
        "drains": [c.name for c in clusters if c.state == ClusterState.DRAINING],
        "ejected_clusters": [c.name for c in clusters if c.state == ClusterState.EJECTED],
        "ejections": [
            {"region": e.region, "instance_id": e.instance_id, "generation": e.generation, "reason": e.reason}
            for e in ejections
        ],
    }
