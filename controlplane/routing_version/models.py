from __future__ import annotations

from datetime import datetime

from sqlalchemy import Integer
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, UTCDateTime


class SnapshotCounter(Base):
    """One row (id=1), seeded by the migration. Its version only ever grows."""

    __tablename__ = "snapshot_counter"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    changed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
