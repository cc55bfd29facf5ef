"""Assemble the routing snapshot gateways and agents apply: a `contract.snapshot.RoutingSnapshot`.

The snapshot domain sits above topology, the catalog and mesh routes and only reads
them; they advance the version (`controlplane.routing_version`) in the
same transaction as every change. `build` reads the version *first*:
content read afterwards can only be as new or newer than the version it
is labelled with, so a gateway never caches stale content under a newer
ETag. The endpoint compares `If-None-Match` with the version before it
calls `build`, so an unchanged poll costs one indexed read, not a
snapshot.

Each version an alias points at carries what a gateway needs to load and
check it: location, semantic fingerprint, `weights_digest` over the
recorded shard digests (`contract.identity.weights_digest`, what engines
report), the sha256 of each tokenizer/template/config file the catalog
recorded, the sha256 of every file it recorded (`shards`: a regional
agent verifies a cold-tier pool's staged copy by them), and its open known
issues.

It also carries the KV replication policies (mode, cadence, declared
RPO_context; no store URLs), so a gateway checkpoints sessions without
calling the control plane on a request's path.

Every snapshot names the database's `controlplane_epoch`, and its ETag
carries it: versions only grow within one database, so a consumer compares
them only within an epoch, and an `If-None-Match` from another database's
equal version does not match.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from contract.identity import weights_digest
from contract.snapshot import (
    AliasEntry,
    ClusterEntry,
    EjectionEntry,
    KnownIssueRef,
    ModelEntry,
    ReplicationPolicyEntry,
    RoutingSnapshot,
    VersionEntry,
    etag_for,
)
from controlplane.mesh_route import service as mesh_route
from controlplane.replication import service as replication
from controlplane.routing_version import service as routing_version
from controlplane.topology.models import ClusterState, InstanceEjection, ServingCluster
from weight_catalog import repository as catalog
from weight_catalog.canary import canary_of

# The files a gateway loads for a version (tokenizer, chat template, configs).
GATEWAY_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json",
                 "generation_config.json")


def current_version(session: Session) -> int:
    return routing_version.current_version(session)


def current_etag(session: Session) -> str:
    """The ETag of the snapshot `build_snapshot` would label now: epoch and version, one indexed read."""
    stamp = routing_version.stamp(session)
    return etag_for(stamp.version, stamp.epoch)


def _models(session: Session) -> dict[str, dict[str, Any]]:
    models: dict[str, dict[str, Any]] = {}
    aliased = catalog.aliases_with_versions(session)
    version_ids = {v.id for _, v in aliased}
    open_issues = catalog.open_issues_by_version(session, version_ids)
    digests = catalog.shard_digests_by_version(session, version_ids)
    for alias, weight_version in aliased:
        model = models.setdefault(alias.model, {"aliases": {}, "versions": {}})
        model["aliases"][alias.name] = AliasEntry(version=weight_version.version, revision=alias.revision)
        recorded = digests.get(weight_version.id, {})
        model["versions"][weight_version.version] = VersionEntry(
            version=weight_version.version,
            fingerprint=weight_version.fingerprint,
            location=weight_version.location,
            weights_digest=weights_digest(recorded),
            files={name: recorded[name] for name in GATEWAY_FILES if name in recorded},
            shards=recorded,  # every recorded file: a cold-tier agent checks its staged copy by them
            # Open issues only, so a gateway or operator sees what is wrong
            # with what it routes to; resolved ones stay in the catalog.
            known_issues=[KnownIssueRef(id=i.id, severity=i.severity, summary=i.title)
                          for i in open_issues.get(weight_version.id, [])],
            canary=canary_of(weight_version),  # `lifeline catalog canary record`; agents check output by it
        )
    return models


def build_snapshot(session: Session) -> RoutingSnapshot:
    stamp = routing_version.stamp(session)  # first: see the module docstring
    models = _models(session)
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
    return RoutingSnapshot(
        version=stamp.version,
        controlplane_epoch=stamp.epoch,
        changed_at=stamp.changed_at,
        models={name: ModelEntry(**entry) for name, entry in models.items()},
        clusters=[
            ClusterEntry(name=c.name, region=c.region, zone=c.zone, model=c.model, endpoint=c.endpoint,
                         weight=c.weight, state=c.state)
            for c in clusters
        ],
        tier_weights=tier_weights,
        drains=[c.name for c in clusters if c.state == ClusterState.DRAINING],
        ejected_clusters=[c.name for c in clusters if c.state == ClusterState.EJECTED],
        ejections=[EjectionEntry(region=e.region, instance_id=e.instance_id, generation=e.generation,
                                 reason=e.reason) for e in ejections],
        mesh_routes=mesh_route.snapshot_routes(session),
        replication_policies=_replication_policies(session),
    )


def _replication_policies(session: Session) -> list[ReplicationPolicyEntry]:
    """Each KV replication policy as gateways need it: when to checkpoint, and the declared RPO_context.

    The store URLs stay here (they may carry credentials); a gateway's engines write to their region's store.
    """
    return [ReplicationPolicyEntry(model=p.model, session_class=p.session_class, mode=p.mode,
                                   every_turns=p.every_turns, every_seconds=p.every_seconds,
                                   rpo_context_seconds=p.rpo_context_seconds, rpo_context_turns=p.rpo_context_turns,
                                   revision=p.revision)
            for p in replication.list_policies(session)]


def build(session: Session) -> dict[str, Any]:
    """The snapshot as the JSON body gateways receive, for readers of that shape (cutover's L7 verify)."""
    return build_snapshot(session).model_dump(mode="json")
