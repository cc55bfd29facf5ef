"""Advance and read the routing-state version. Never commits.

Any change to desired routing state (alias moves, cluster create/update/
delete, drains, ejections and readmissions) or to what the snapshot shows
about a version (a known issue opened or resolved) calls `bump` in the same
transaction, so the version only grows and changes exactly when the
snapshot's content can have changed.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from common.clock import Clock
from controlplane.routing_version.models import SnapshotCounter


def bump(session: Session, *, clock: Clock) -> int:
    session.execute(
        update(SnapshotCounter)
        .where(SnapshotCounter.id == 1)
        .values(version=SnapshotCounter.version + 1, changed_at=clock.utcnow())
    )
    return current_version(session)


def current_version(session: Session) -> int:
    return session.scalar(select(SnapshotCounter.version).where(SnapshotCounter.id == 1)) or 0


def current(session: Session) -> tuple[int, datetime | None]:
    """(version, changed_at) in one read."""
    row = session.execute(
        select(SnapshotCounter.version, SnapshotCounter.changed_at).where(SnapshotCounter.id == 1)
    ).first()
    return (row[0], row[1]) if row else (0, None)
