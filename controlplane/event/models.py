from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, CheckConstraint, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, UTCDateTime


class Event(Base):
    """One fact that happened. Rows are only ever inserted."""

    __tablename__ = "events"
    __table_args__ = (
        CheckConstraint(
            "routing_tier IS NULL OR routing_tier IN ('l7', 'mesh', 'anycast', 'dns')",
            name="routing_tier",
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(64), index=True)
    routing_tier: Mapped[str | None] = mapped_column(String(8), nullable=True, index=True)
    actor: Mapped[str] = mapped_column(String(160), index=True)
    reason: Mapped[str] = mapped_column(Text)
    scope: Mapped[str] = mapped_column(String(400), index=True)
    before: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    after: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    outcome: Mapped[str] = mapped_column(String(16))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    ended_at: Mapped[datetime] = mapped_column(UTCDateTime())
