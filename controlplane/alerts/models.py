"""One row per alert Alertmanager delivered: what makes its retries harmless."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, CheckConstraint, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, UTCDateTime


class AlertDelivery(Base):
    """An alert as Lifeline acted on it, keyed by Alertmanager's fingerprint, start and status.

    Alertmanager delivers at least once: it sends a firing alert again at every
    `repeat_interval` and retries a delivery that failed or timed out. The
    first delivery of a key claims it (`acting`) and acts; the others are
    counted and answered `duplicate`. A claim whose action never finished (the
    process died) is taken again after `STALE_CLAIM` (alerts/service.py).
    """

    __tablename__ = "alert_deliveries"
    __table_args__ = (CheckConstraint("state IN ('acting', 'done')", name="state"),)

    key: Mapped[str] = mapped_column(String(400), primary_key=True)
    alertname: Mapped[str] = mapped_column(String(200), index=True)
    action: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16))
    outcome: Mapped[str | None] = mapped_column(String(32), nullable=True)
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    deliveries: Mapped[int] = mapped_column(Integer, default=1)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
