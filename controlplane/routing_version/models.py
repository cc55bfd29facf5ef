from __future__ import annotations

from datetime import datetime

from sqlalchemy import Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, UTCDateTime


class SnapshotCounter(Base):
    """One row (id=1), seeded by the migration. Its version only ever grows, within its epoch.

    `epoch` names this database's line of versions (a uuid made by migration
    0010, a new one from `lifeline controlplane epoch rotate`): a fresh or
    restored database counts again from lower versions, and consumers
    compare versions only within one epoch.
    """

    __tablename__ = "snapshot_counter"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    changed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    epoch: Mapped[str] = mapped_column(String(64))
