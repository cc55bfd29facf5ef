"""Store the last report of each gateway replica; read them back with staleness. Never commits."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from common.clock import Clock
from contract.events import GatewayReport
from controlplane.errors import InvalidInput
from controlplane.gateway_report.models import GatewayReportRow
from controlplane.gateway_report.schemas import GatewayReportRead
from controlplane.latest_report import keep_newest
from controlplane.routing_version import service as routing_version
from controlplane.types import first_nul

# How far ahead of ours a gateway's clock may be before its reports are refused.
MAX_CLOCK_SKEW = timedelta(minutes=5)


def _fields(report: GatewayReport) -> dict[str, object]:
    return {
        "region": report.region, "zone": report.zone, "routing_source": report.routing_source,
        "snapshot_version": report.snapshot_version, "snapshot_epoch": report.snapshot_epoch,
        "snapshot_applied_at": report.snapshot_applied_at,
        "live_endpoints": [e.model_dump(mode="json") for e in report.live_endpoints],
        "suppressed": report.suppressed, "ejected": report.ejected, "reported_at": report.reported_at,
    }


def store(session: Session, *, replica_id: str, report: GatewayReport, actor: str, clock: Clock) -> GatewayReportRow:
    """Keep `report` as the replica's last one, unless a newer one (by `reported_at`) is already stored.

    Out of order after a retry: an older one is acknowledged and dropped (`keep_newest`).
    """
    if report.replica_id != replica_id:
        raise InvalidInput(f"the report names replica {report.replica_id!r}, the path {replica_id!r}",
                           param="replica_id")
    nul = first_nul(report.model_dump(mode="json"))
    if nul:
        raise InvalidInput(f"{nul} contains a NUL byte", param=nul)
    now = clock.utcnow()
    if report.reported_at > now + MAX_CLOCK_SKEW:  # naive is UTC already (contract.events.UtcTimestamp)
        # Ordering is by reported_at; one from the far future would shadow every later report.
        raise InvalidInput(f"reported_at {report.reported_at.isoformat()} is more than {MAX_CLOCK_SKEW} ahead of "
                           "the control plane's clock; fix the gateway's clock", param="reported_at")
    return keep_newest(session, GatewayReportRow, replica_id, fields=_fields(report), ordered_by="reported_at",
                       received_at=now, actor=actor)


def read(row: GatewayReportRow, *, clock: Clock, stale_after: timedelta, epoch: str | None) -> GatewayReportRead:
    """`epoch`: this database's (`routing_version.current_epoch`); a snapshot from any other is foreign."""
    age = (clock.utcnow() - row.received_at).total_seconds()
    return GatewayReportRead(
        replica_id=row.replica_id, region=row.region, zone=row.zone, routing_source=row.routing_source,  # type: ignore[arg-type]
        snapshot_version=row.snapshot_version, snapshot_epoch=row.snapshot_epoch,
        snapshot_applied_at=row.snapshot_applied_at,
        live_endpoints=row.live_endpoints, suppressed=row.suppressed, ejected=row.ejected,  # type: ignore[arg-type]
        reported_at=row.reported_at, received_at=row.received_at, reported_by=row.reported_by,
        age_s=round(age, 3), stale=age > stale_after.total_seconds(),
        foreign_epoch=row.snapshot_version is not None and row.snapshot_epoch != epoch,
    )


def list_reports(session: Session, *, clock: Clock, stale_after: timedelta,
                 region: str | None = None) -> list[GatewayReportRead]:
    query = select(GatewayReportRow).order_by(GatewayReportRow.region, GatewayReportRow.replica_id)
    if region is not None:
        query = query.where(GatewayReportRow.region == region)
    epoch = routing_version.current_epoch(session)
    return [read(row, clock=clock, stale_after=stale_after, epoch=epoch) for row in session.scalars(query)]


def applied_versions(session: Session, *, region: str, clock: Clock, stale_after: timedelta) -> dict[str, int | None]:
    """Replica → the snapshot version it applied, for a cutover step's read-back.

    A stale replica's version is None, never its last known one: a gateway
    that stopped reporting has not been seen to apply anything since. So is
    a version from another control-plane epoch: it counts another
    database's changes, not this one's.
    """
    return {r.replica_id: None if r.stale or r.foreign_epoch else r.snapshot_version
            for r in list_reports(session, clock=clock, stale_after=stale_after, region=region)}
