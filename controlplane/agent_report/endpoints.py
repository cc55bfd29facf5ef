"""`PUT /agents/{region}` (the region's agent reports) and `GET /agents` (people read)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from contract.events import AgentReport
from controlplane.agent_report import service
from controlplane.routing_version import service as routing_version
from controlplane.agent_report.schemas import AgentReportRead
from controlplane.auth.dependencies import AgentReporter, Viewer
from controlplane.db import DbSession
from controlplane.deps import ClockDep, SettingsDep
from controlplane.types import NAME_PATTERN

router = APIRouter(tags=["agents"])

RegionPath = Annotated[str, Path(min_length=1, max_length=128, pattern=NAME_PATTERN)]


@router.put("/agents/{region}", response_model=AgentReportRead)
def report(region: RegionPath, body: AgentReport, session: DbSession, principal: AgentReporter,
           clock: ClockDep, settings: SettingsDep) -> AgentReportRead:
    """The region's agent's view: per instance its verdict, pool state, lease and last canary (the newest kept)."""
    row = service.store(session, region=region, report=body, actor=principal.actor, clock=clock)
    return service.read(row, clock=clock, stale_after=settings.agent_report_stale_after,
                        epoch=routing_version.current_epoch(session))


@router.get("/agents", response_model=list[AgentReportRead])
def list_agents(
    session: DbSession, _: Viewer, clock: ClockDep, settings: SettingsDep,
    region: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=128)] = None,
) -> list[AgentReportRead]:
    """Every region's last agent report, `stale` when older than LIFELINE_CONTROLPLANE_AGENT_REPORT_STALE_AFTER."""
    return service.list_reports(session, clock=clock, stale_after=settings.agent_report_stale_after, region=region)
