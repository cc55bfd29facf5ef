from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, UTCDateTime


class GatewayReportRow(Base):
    """The last `contract.events.GatewayReport` of one gateway replica."""

    __tablename__ = "gateway_reports"

    replica_id: Mapped[str] = mapped_column(String(160), primary_key=True)
    region: Mapped[str] = mapped_column(String(128), index=True)
    zone: Mapped[str] = mapped_column(String(128))
    routing_source: Mapped[str] = mapped_column(String(16))
    snapshot_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    snapshot_epoch: Mapped[str | None] = mapped_column(String(64), nullable=True)  # the version counts in this
    snapshot_applied_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    live_endpoints: Mapped[list[Any]] = mapped_column(JSON)
    suppressed: Mapped[int] = mapped_column(Integer)
    ejected: Mapped[int] = mapped_column(Integer)
    reported_at: Mapped[datetime] = mapped_column(UTCDateTime())  # the gateway's clock
    received_at: Mapped[datetime] = mapped_column(UTCDateTime())  # ours: staleness is computed from this
    reported_by: Mapped[str] = mapped_column(String(160))  # the token that sent it
