"""`PUT /gateways/{replica_id}` (gateways report) and `GET /gateways` (people read)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from contract.events import GatewayReport
from controlplane.auth.dependencies import GatewayReporter, GatewayReportReader
from controlplane.db import DbSession
from controlplane.deps import ClockDep, SettingsDep
from controlplane.gateway_report import service
from controlplane.gateway_report.schemas import GatewayReportRead
from controlplane.routing_version import service as routing_version
from controlplane.types import NAME_PATTERN

router = APIRouter(tags=["gateways"])

ReplicaPath = Annotated[str, Path(min_length=1, max_length=160, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,159}$")]


@router.put("/gateways/{replica_id}", response_model=GatewayReportRead)
def report(replica_id: ReplicaPath, body: GatewayReport, session: DbSession, principal: GatewayReporter,
           clock: ClockDep, settings: SettingsDep) -> GatewayReportRead:
    """A gateway replica's state as it sees it; the last one per replica is kept (an older one is ignored)."""
    row = service.store(session, replica_id=replica_id, report=body, actor=principal.actor, clock=clock)
    return service.read(row, clock=clock, stale_after=settings.gateway_report_stale_after,
                        epoch=routing_version.current_epoch(session))


@router.get("/gateways", response_model=list[GatewayReportRead])
def list_gateways(
    session: DbSession, _: GatewayReportReader, clock: ClockDep, settings: SettingsDep,
    region: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=128)] = None,
) -> list[GatewayReportRead]:
    """Every replica's last report, `stale` when older than LIFELINE_CONTROLPLANE_GATEWAY_REPORT_STALE_AFTER."""
    return service.list_reports(session, clock=clock, stale_after=settings.gateway_report_stale_after, region=region)
