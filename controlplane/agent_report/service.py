"""Store the last report of each region's agent; read them back with staleness. Never commits."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from common.clock import Clock
from contract.events import AgentReport
from controlplane.agent_report.models import AgentReportRow
from controlplane.agent_report.schemas import AgentReportRead
from controlplane.errors import InvalidInput
from controlplane.latest_report import keep_newest
from controlplane.routing_version import service as routing_version
from controlplane.types import first_nul

# How far ahead of ours an agent's clock may be before its reports are refused.
MAX_CLOCK_SKEW = timedelta(minutes=5)


def _fields(report: AgentReport) -> dict[str, object]:
    return {
        "agent_id": report.agent_id, "snapshot_version": report.snapshot_version,
        "snapshot_epoch": report.snapshot_epoch, "sent_at": report.sent_at,
        "instances": [i.model_dump(mode="json") for i in report.instances],
        "staging": [s.model_dump(mode="json") for s in report.staging] if report.staging is not None else None,
    }


def _check(report: AgentReport, *, region: str, clock: Clock) -> None:
    if report.region != region:
        raise InvalidInput(f"the report names region {report.region!r}, the path {region!r}", param="region")
    nul = first_nul(report.model_dump(mode="json"))
    if nul:
        raise InvalidInput(f"{nul} contains a NUL byte", param=nul)
    ids = [i.instance_id for i in report.instances]
    if len(set(ids)) != len(ids):
        twice = sorted({i for i in ids if ids.count(i) > 1})
        raise InvalidInput(f"instances: each instance once, got {twice[:5]} more than once", param="instances")
    if report.sent_at > clock.utcnow() + MAX_CLOCK_SKEW:  # naive is UTC already (contract.events.UtcTimestamp)
        # Ordering is by sent_at; one from the far future would shadow every later report.
        raise InvalidInput(f"sent_at {report.sent_at.isoformat()} is more than {MAX_CLOCK_SKEW} ahead of the "
                           "control plane's clock; fix the agent's clock", param="sent_at")


def store(session: Session, *, region: str, report: AgentReport, actor: str, clock: Clock) -> AgentReportRow:
    """Keep `report` as the region's last one, unless a newer one (by `sent_at`) is already stored.

    Out of order after a retry: an older one is acknowledged and dropped
    (`keep_newest`). A newer report from another agent id (a restarted agent,
    a new pod) replaces the last one: one agent watches a region.
    """
    _check(report, region=region, clock=clock)
    return keep_newest(session, AgentReportRow, region, fields=_fields(report), ordered_by="sent_at",
                       received_at=clock.utcnow(), actor=actor)


def read(row: AgentReportRow, *, clock: Clock, stale_after: timedelta, epoch: str | None) -> AgentReportRead:
    """`epoch`: this database's (`routing_version.current_epoch`); a snapshot from any other is foreign."""
    age = (clock.utcnow() - row.received_at).total_seconds()
    return AgentReportRead(
        region=row.region, agent_id=row.agent_id, sent_at=row.sent_at, snapshot_version=row.snapshot_version,
        snapshot_epoch=row.snapshot_epoch,
        foreign_epoch=row.snapshot_version is not None and row.snapshot_epoch != epoch,
        instances=row.instances,  # type: ignore[arg-type]
        staging=row.staging,  # type: ignore[arg-type]
        received_at=row.received_at, reported_by=row.reported_by, age_s=round(age, 3),
        stale=age > stale_after.total_seconds(),
    )


def list_reports(session: Session, *, clock: Clock, stale_after: timedelta,
                 region: str | None = None) -> list[AgentReportRead]:
    query = select(AgentReportRow).order_by(AgentReportRow.region)
    if region is not None:
        query = query.where(AgentReportRow.region == region)
    epoch = routing_version.current_epoch(session)
    return [read(row, clock=clock, stale_after=stale_after, epoch=epoch) for row in session.scalars(query)]
