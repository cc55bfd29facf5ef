"""Advance and read the routing-state version. Never commits.

Any change to desired routing state (alias moves, cluster create/update/
delete, drains, ejections and readmissions) or to what the snapshot shows
about a version (a known issue opened or resolved) calls `bump` in the same
transaction, so the version only grows and changes exactly when the
snapshot's content can have changed.

The version grows within the database's epoch (see the model): `stamp`
reads both, and `rotate_epoch` starts a new epoch for a database that was
restored from a backup (its versions went back) or cloned.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import NamedTuple

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


class RoutingStamp(NamedTuple):
    """What labels a snapshot: its version, when it last changed, and the epoch the version counts in."""

    version: int
    changed_at: datetime | None
    epoch: str | None


def stamp(session: Session) -> RoutingStamp:
    """Version, changed_at and epoch in one read (the snapshot reads this before its content)."""
    row = session.execute(
        select(SnapshotCounter.version, SnapshotCounter.changed_at, SnapshotCounter.epoch)
        .where(SnapshotCounter.id == 1)
    ).first()
    return RoutingStamp(row[0], row[1], row[2]) if row else RoutingStamp(0, None, None)


def current_epoch(session: Session) -> str | None:
    return session.scalar(select(SnapshotCounter.epoch).where(SnapshotCounter.id == 1))


def rotate_epoch(session: Session, *, clock: Clock) -> tuple[str | None, str]:
    """Give this database a new epoch (and advance the version); (old epoch, new epoch).

    For a database restored from a backup or cloned from another: its
    versions are ones gateways have already seen with other content, so they
    must be told apart. Consumers take the next snapshot whatever its version.
    """
    old = current_epoch(session)
    new = str(uuid.uuid4())
    session.execute(
        update(SnapshotCounter)
        .where(SnapshotCounter.id == 1)
        .values(epoch=new, version=SnapshotCounter.version + 1, changed_at=clock.utcnow())
    )
    return old, new
