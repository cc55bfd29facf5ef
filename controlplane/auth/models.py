from __future__ import annotations

from datetime import datetime

from sqlalchemy import Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, UTCDateTime


class ApiToken(Base):
    """A bearer token. Only the sha256 of the secret is stored."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16))
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    created_by: Mapped[str] = mapped_column(String(160))
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    revoked_by: Mapped[str | None] = mapped_column(String(160), nullable=True)

    @property
    def active(self) -> bool:
        return self.revoked_at is None


class AuditRecord(Base):
    """One mutating call: who, when, what, on what, and how it ended."""

    __tablename__ = "audit_records"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    actor: Mapped[str] = mapped_column(String(160), index=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    action: Mapped[str] = mapped_column(String(160))
    target: Mapped[str] = mapped_column(String(1000))
    outcome: Mapped[str] = mapped_column(String(16))
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
