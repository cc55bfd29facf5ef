from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from controlplane.auth.dependencies import Operator, Viewer
from controlplane.db import DbSession
from controlplane.deps import ClockDep, IdPath, NamePath
from controlplane.topology.dependencies import LeaseReaderDep
from controlplane.topology import repository, service
from controlplane.topology.schemas import (
    ClusterCreate,
    ClusterRead,
    ClusterUpdate,
    EjectionCreate,
    EjectionRead,
    InstanceRead,
    RegionCreate,
    RegionRead,
    ZoneCreate,
    ZoneRead,
)
from controlplane.types import NAME_PATTERN, Reason

router = APIRouter(tags=["topology"])

NameQuery = Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=128)]


@router.get("/regions", response_model=list[RegionRead])
def list_regions(session: DbSession, _: Viewer) -> list[RegionRead]:
    zones = repository.zones_by_region(session)
    return [
        RegionRead(name=r.name, description=r.description, created_at=r.created_at, zones=zones.get(r.name, []))
        for r in service.list_regions(session)
    ]


@router.post("/regions", status_code=201, response_model=RegionRead)
def create_region(body: RegionCreate, session: DbSession, principal: Operator, clock: ClockDep) -> RegionRead:
    region = service.create_region(
        session, name=body.name, description=body.description, actor=principal.actor, clock=clock
    )
    return RegionRead(name=region.name, description=region.description, created_at=region.created_at)


@router.get("/regions/{region}", response_model=RegionRead)
def get_region(region: NamePath, session: DbSession, _: Viewer) -> RegionRead:
    found = service.get_region_or_raise(session, name=region)
    zones = repository.zones_by_region(session).get(found.name, [])
    return RegionRead(name=found.name, description=found.description, created_at=found.created_at, zones=zones)


@router.delete("/regions/{region}", status_code=204)
def delete_region(
    region: NamePath,
    session: DbSession,
    principal: Operator,
    clock: ClockDep,
    reader: LeaseReaderDep,
    reason: Annotated[Reason, Query(min_length=1, max_length=2000)],
) -> Response:
    """Delete a region and its zones; 409 region_not_empty while it has clusters, ejections or live instances."""
    service.delete_region(session, name=region, reason=reason, reader=reader, actor=principal.actor, clock=clock)
    return Response(status_code=204)


@router.post("/regions/{region}/zones", status_code=201, response_model=ZoneRead)
def create_zone(region: NamePath, body: ZoneCreate, session: DbSession, principal: Operator, clock: ClockDep) -> ZoneRead:
    zone = service.create_zone(session, region=region, name=body.name, actor=principal.actor, clock=clock)
    return ZoneRead.model_validate(zone)


@router.get("/regions/{region}/instances", response_model=list[InstanceRead])
def observed_instances(
    region: NamePath, session: DbSession, _: Viewer, clock: ClockDep, reader: LeaseReaderDep
) -> list[InstanceRead]:
    return service.observed_instances(session, region=region, reader=reader, clock=clock)


@router.get("/regions/{region}/ejections", response_model=list[EjectionRead])
def list_ejections(region: NamePath, session: DbSession, _: Viewer) -> list[EjectionRead]:
    return [EjectionRead.model_validate(e) for e in service.list_ejections(session, region=region)]


@router.post("/regions/{region}/ejections", status_code=201, response_model=EjectionRead)
def eject_instance(
    region: NamePath, body: EjectionCreate, session: DbSession, principal: Operator, clock: ClockDep
) -> EjectionRead:
    ejection = service.eject_instance(
        session, region=region, instance_id=body.instance_id, generation=body.generation,
        reason=body.reason, actor=principal.actor, clock=clock,
    )
    return EjectionRead.model_validate(ejection)


@router.delete("/regions/{region}/ejections/{ejection_id}", status_code=204)
def lift_ejection(
    region: NamePath,
    ejection_id: IdPath,
    session: DbSession,
    principal: Operator,
    clock: ClockDep,
    reason: Annotated[Reason, Query(min_length=1, max_length=2000)],
) -> Response:
    service.lift_ejection(session, region=region, ejection_id=ejection_id, reason=reason, actor=principal.actor, clock=clock)
    return Response(status_code=204)


@router.get("/clusters", response_model=list[ClusterRead])
def list_clusters(session: DbSession, _: Viewer, model: NameQuery = None, region: NameQuery = None) -> list[ClusterRead]:
    return [ClusterRead.model_validate(c) for c in service.list_clusters(session, model=model, region=region)]


@router.post("/clusters", status_code=201, response_model=ClusterRead)
def create_cluster(body: ClusterCreate, session: DbSession, principal: Operator, clock: ClockDep) -> ClusterRead:
    return ClusterRead.model_validate(service.create_cluster(session, spec=body, actor=principal.actor, clock=clock))


@router.get("/clusters/{name}", response_model=ClusterRead)
def get_cluster(name: NamePath, session: DbSession, _: Viewer) -> ClusterRead:
    return ClusterRead.model_validate(service.get_cluster_or_raise(session, name=name))


@router.patch("/clusters/{name}", response_model=ClusterRead)
def update_cluster(
    name: NamePath, body: ClusterUpdate, session: DbSession, principal: Operator, clock: ClockDep
) -> ClusterRead:
    cluster = service.update_cluster(session, name=name, change=body, actor=principal.actor, clock=clock)
    return ClusterRead.model_validate(cluster)


@router.delete("/clusters/{name}", status_code=204)
def delete_cluster(
    name: NamePath,
    session: DbSession,
    principal: Operator,
    clock: ClockDep,
    reason: Annotated[Reason, Query(min_length=1, max_length=2000)],
    expected_revision: Annotated[int | None, Query(ge=0, le=2**31 - 1)] = None,
) -> Response:
    """Delete an ejected cluster; 409 cluster_in_service while it is active or draining."""
    service.delete_cluster(
        session, name=name, reason=reason, expected_revision=expected_revision, actor=principal.actor, clock=clock
    )
    return Response(status_code=204)
