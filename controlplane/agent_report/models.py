from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, UTCDateTime


class AgentReportRow(Base):
    """The last `contract.events.AgentReport` of one region's agent."""

    __tablename__ = "agent_reports"

    region: Mapped[str] = mapped_column(String(128), primary_key=True)
    agent_id: Mapped[str] = mapped_column(String(160))
    snapshot_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    snapshot_epoch: Mapped[str | None] = mapped_column(String(64), nullable=True)  # the version counts in this
    instances: Mapped[list[Any]] = mapped_column(JSON)
    staging: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)  # a cold pool's check; None: no cold pool
    sent_at: Mapped[datetime] = mapped_column(UTCDateTime())  # the agent's clock
    received_at: Mapped[datetime] = mapped_column(UTCDateTime())  # ours: staleness is computed from this
    reported_by: Mapped[str] = mapped_column(String(160))  # the token that sent it
