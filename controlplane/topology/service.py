"""Declared topology and observed instances. Never commits.

Every change writes an event; changes that alter routing (cluster weight or
state, instance ejections) also advance the snapshot version.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from common.clock import Clock
from controlplane.errors import InvalidInput
from controlplane.event import service as event_service
from contract.routing_tier import RoutingTier
from controlplane.routing_version import service as routing_version
from controlplane.topology import repository
from controlplane.topology.errors import (
    ClusterConflict,
    ClusterInService,
    ClusterNotFound,
    EjectionNotFound,
    RegionNotEmpty,
    RegionNotFound,
    TopologyExists,
    ZoneNotFound,
)
from controlplane.topology.lease import LeaseReader
from controlplane.topology.models import ClusterState, InstanceEjection, Region, ServingCluster, Zone
from controlplane.topology.schemas import ClusterCreate, ClusterUpdate, InstanceRead


def _flush_or_conflict(session: Session, what: str) -> None:
    try:
        with session.begin_nested():
            session.flush()
    except IntegrityError as exc:
        raise TopologyExists(f"{what} already exists") from exc


def get_region_or_raise(session: Session, *, name: str) -> Region:
    region = repository.get_region(session, name=name)
    if region is None:
        raise RegionNotFound(f"no region {name!r}")
    return region


def list_regions(session: Session) -> Sequence[Region]:
    return repository.list_regions(session)


def create_region(session: Session, *, name: str, description: str, actor: str, clock: Clock) -> Region:
    if repository.get_region(session, name=name) is not None:
        raise TopologyExists(f"region {name!r} already exists")
    region = Region(name=name, description=description, created_at=clock.utcnow())
    session.add(region)
    _flush_or_conflict(session, f"region {name!r}")
    event_service.record(
        session, kind="topology.region.create", actor=actor, reason="", scope=f"region:{name}",
        after={"name": name}, clock=clock,
    )
    return region


def delete_region(
    session: Session, *, name: str, reason: str, reader: LeaseReader, actor: str, clock: Clock
) -> None:
    """Delete an empty region and its zones.

    Refused while it has serving clusters or ejections (delete or lift
    those first) or while its lease registry shows a live instance: the
    region is still serving, whatever the declared topology says. Zones
    are names inside the region and go with it.
    """
    region = get_region_or_raise(session, name=name)
    clusters = [c.name for c in repository.list_clusters(session, model=None, region=name)]
    ejections = repository.list_ejections(session, region=name)
    now = clock.wall()
    live = [i.instance_id for i in reader.list_instances(name) if i.is_live(now)]
    blockers = []
    if clusters:
        blockers.append(f"serving clusters {', '.join(clusters)}")
    if ejections:
        blockers.append(f"{len(ejections)} ejection(s)")
    if live:
        blockers.append(f"live instances {', '.join(live[:10])}")
    if blockers:
        raise RegionNotEmpty(f"region {name!r} still has {'; '.join(blockers)}")
    zones = repository.zones_by_region(session).get(name, [])
    session.execute(delete(Zone).where(Zone.region == name))
    session.delete(region)
    session.flush()
    event_service.record(
        session, kind="topology.region.delete", actor=actor, reason=reason, scope=f"region:{name}",
        before={"name": name, "zones": zones}, after=None, clock=clock,
    )


def create_zone(session: Session, *, region: str, name: str, actor: str, clock: Clock) -> Zone:
    get_region_or_raise(session, name=region)
    if repository.get_zone(session, region=region, name=name) is not None:
        raise TopologyExists(f"zone {name!r} already exists in {region!r}")
    zone = Zone(region=region, name=name, created_at=clock.utcnow())
    session.add(zone)
    _flush_or_conflict(session, f"zone {name!r} in {region!r}")
    event_service.record(
        session, kind="topology.zone.create", actor=actor, reason="", scope=f"region:{region}/zone:{name}",
        after={"region": region, "zone": name}, clock=clock,
    )
    return zone


def _cluster_state(cluster: ServingCluster) -> dict[str, object]:
    return {"weight": cluster.weight, "state": cluster.state, "revision": cluster.revision}


def get_cluster_or_raise(session: Session, *, name: str) -> ServingCluster:
    cluster = repository.get_cluster(session, name=name)
    if cluster is None:
        raise ClusterNotFound(f"no serving cluster {name!r}")
    return cluster


def list_clusters(session: Session, *, model: str | None = None, region: str | None = None) -> Sequence[ServingCluster]:
    return repository.list_clusters(session, model=model, region=region)


def create_cluster(session: Session, *, spec: ClusterCreate, actor: str, clock: Clock) -> ServingCluster:
    get_region_or_raise(session, name=spec.region)
    if spec.zone is not None and repository.get_zone(session, region=spec.region, name=spec.zone) is None:
        raise ZoneNotFound(f"region {spec.region!r} has no zone {spec.zone!r}")
    if repository.get_cluster(session, name=spec.name) is not None:
        raise TopologyExists(f"serving cluster {spec.name!r} already exists")
    cluster = ServingCluster(
        name=spec.name,
        region=spec.region,
        zone=spec.zone,
        model=spec.model,
        endpoint=spec.endpoint,
        weight=spec.weight,
        state=ClusterState.ACTIVE.value,
        revision=1,
        updated_at=clock.utcnow(),
    )
    session.add(cluster)
    _flush_or_conflict(session, f"serving cluster {spec.name!r}")
    event_service.record(
        session, kind="topology.cluster.create", actor=actor, reason="",
        scope=f"region:{spec.region}/cluster:{spec.name}", after=_cluster_state(cluster), clock=clock,
    )
    routing_version.bump(session, clock=clock)
    return cluster


def update_cluster(session: Session, *, name: str, change: ClusterUpdate, actor: str, clock: Clock) -> ServingCluster:
    """Change weight and/or state by compare-and-set on the cluster's revision."""
    if change.weight is None and change.state is None:
        raise InvalidInput("give a weight or a state to change")
    started_at = clock.utcnow()
    cluster = get_cluster_or_raise(session, name=name)
    if change.expected_revision is not None and change.expected_revision != cluster.revision:
        raise ClusterConflict(f"cluster {name!r} is at revision {cluster.revision}, not {change.expected_revision}")
    before = _cluster_state(cluster)
    weight = change.weight if change.weight is not None else cluster.weight
    state = change.state.value if change.state is not None else cluster.state
    result = session.execute(
        update(ServingCluster)
        .where(ServingCluster.name == name, ServingCluster.revision == cluster.revision)
        .values(weight=weight, state=state, revision=cluster.revision + 1, updated_at=started_at)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:
        raise ClusterConflict(f"cluster {name!r} changed concurrently; retry")
    session.refresh(cluster)
    event_service.record(
        session, kind="topology.cluster.update", routing_tier=change.routing_tier, actor=actor,
        reason=change.reason, scope=f"region:{cluster.region}/cluster:{name}", before=before,
        after=_cluster_state(cluster), started_at=started_at, clock=clock,
    )
    routing_version.bump(session, clock=clock)
    return cluster


def delete_cluster(
    session: Session, *, name: str, reason: str, expected_revision: int | None, actor: str, clock: Clock
) -> None:
    """Delete a cluster that is already out of routing (state `ejected`).

    An active or draining cluster may still carry requests; eject it first
    (a routing change with its own event), then delete it.
    """
    cluster = get_cluster_or_raise(session, name=name)
    if expected_revision is not None and expected_revision != cluster.revision:
        raise ClusterConflict(f"cluster {name!r} is at revision {cluster.revision}, not {expected_revision}")
    if cluster.state != ClusterState.EJECTED:
        raise ClusterInService(f"cluster {name!r} is {cluster.state}; eject it before deleting it")
    before = {**_cluster_state(cluster), "region": cluster.region, "zone": cluster.zone, "model": cluster.model}
    result = session.execute(
        delete(ServingCluster)
        .where(
            ServingCluster.name == name,
            ServingCluster.revision == cluster.revision,
            ServingCluster.state == ClusterState.EJECTED.value,
        )
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:
        raise ClusterConflict(f"cluster {name!r} changed concurrently; retry")
    session.expunge(cluster)
    event_service.record(
        session, kind="topology.cluster.delete", actor=actor, reason=reason,
        scope=f"region:{before['region']}/cluster:{name}", before=before, after=None, clock=clock,
    )
    routing_version.bump(session, clock=clock)  # it leaves the snapshot's cluster list


def eject_instance(
    session: Session, *, region: str, instance_id: str, generation: int, reason: str, actor: str, clock: Clock
) -> InstanceEjection:
    get_region_or_raise(session, name=region)
    if repository.find_ejection(session, region=region, instance_id=instance_id, generation=generation):
        raise TopologyExists(f"{instance_id} generation {generation} is already ejected")
    ejection = InstanceEjection(
        region=region, instance_id=instance_id, generation=generation, reason=reason, actor=actor,
        created_at=clock.utcnow(),
    )
    session.add(ejection)
    _flush_or_conflict(session, f"ejection of {instance_id} generation {generation}")
    event_service.record(
        session, kind="topology.instance.eject", routing_tier=RoutingTier.L7, actor=actor, reason=reason,
        scope=f"region:{region}/instance:{instance_id}", before={"ejected": False},
        after={"ejected": True, "generation": generation}, clock=clock,
    )
    routing_version.bump(session, clock=clock)
    return ejection


def lift_ejection(session: Session, *, region: str, ejection_id: int, reason: str, actor: str, clock: Clock) -> None:
    ejection = repository.get_ejection(session, ejection_id=ejection_id)
    if ejection is None or ejection.region != region:
        raise EjectionNotFound(f"region {region!r} has no ejection {ejection_id}")
    session.delete(ejection)
    session.flush()
    event_service.record(
        session, kind="topology.instance.readmit", routing_tier=RoutingTier.L7, actor=actor, reason=reason,
        scope=f"region:{region}/instance:{ejection.instance_id}",
        before={"ejected": True, "generation": ejection.generation}, after={"ejected": False}, clock=clock,
    )
    routing_version.bump(session, clock=clock)


def list_ejections(session: Session, *, region: str) -> Sequence[InstanceEjection]:
    get_region_or_raise(session, name=region)
    return repository.list_ejections(session, region=region)


def observed_instances(session: Session, *, region: str, reader: LeaseReader, clock: Clock) -> list[InstanceRead]:
    """Instances in the region's lease registry; liveness computed now, never stored."""
    get_region_or_raise(session, name=region)
    now = clock.wall()
    ejected = {(e.instance_id, e.generation) for e in repository.list_ejections(session, region=region)}
    return [
        InstanceRead(
            instance_id=i.instance_id,
            generation=i.generation,
            url=i.url,
            version=i.version,
            zone=i.zone,
            lease_expires_at=i.expires_at_datetime(),
            live=i.is_live(now),
            ejected=(i.instance_id, i.generation) in ejected,
        )
        for i in reader.list_instances(region)
    ]
