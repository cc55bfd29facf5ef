from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.topology.models import InstanceEjection, Region, ServingCluster, Zone


def get_region(session: Session, *, name: str) -> Region | None:
    return session.get(Region, name)


def list_regions(session: Session) -> Sequence[Region]:
    return session.scalars(select(Region).order_by(Region.name)).all()


def zones_by_region(session: Session) -> dict[str, list[str]]:
    zones: dict[str, list[str]] = {}
    for zone in session.scalars(select(Zone).order_by(Zone.region, Zone.name)):
        zones.setdefault(zone.region, []).append(zone.name)
    return zones


def get_zone(session: Session, *, region: str, name: str) -> Zone | None:
    return session.scalar(select(Zone).where(Zone.region == region, Zone.name == name))


def get_cluster(session: Session, *, name: str) -> ServingCluster | None:
    return session.get(ServingCluster, name)


def list_clusters(session: Session, *, model: str | None, region: str | None) -> Sequence[ServingCluster]:
    query = select(ServingCluster).order_by(ServingCluster.name)
    if model is not None:
        query = query.where(ServingCluster.model == model)
    if region is not None:
        query = query.where(ServingCluster.region == region)
    return session.scalars(query).all()


def get_ejection(session: Session, *, ejection_id: int) -> InstanceEjection | None:
    return session.get(InstanceEjection, ejection_id)


def find_ejection(session: Session, *, region: str, instance_id: str, generation: int) -> InstanceEjection | None:
    return session.scalar(
        select(InstanceEjection).where(
            InstanceEjection.region == region,
            InstanceEjection.instance_id == instance_id,
            InstanceEjection.generation == generation,
        )
    )


def list_ejections(session: Session, *, region: str | None = None) -> Sequence[InstanceEjection]:
    query = select(InstanceEjection).order_by(InstanceEjection.id)
    if region is not None:
        query = query.where(InstanceEjection.region == region)
    return session.scalars(query).all()
