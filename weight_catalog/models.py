from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from controlplane.db import Base, UTCDateTime


class Severity(StrEnum):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"


class AliasAction(StrEnum):
    PROMOTE = "promote"
    ROLLBACK = "rollback"


class WeightVersion(Base):
    __tablename__ = "weight_versions"
    __table_args__ = (UniqueConstraint("model", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(128), index=True)
    version: Mapped[str] = mapped_column(String(128))
    location: Mapped[str] = mapped_column(String(1000))
    total_bytes: Mapped[int] = mapped_column(BigInteger)
    fingerprint: Mapped[str] = mapped_column(String(64))
    fingerprint_parts: Mapped[dict[str, Any]] = mapped_column(JSON)
    registered_by: Mapped[str] = mapped_column(String(160))
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # The last verify: None until one ran. A failed one blocks promotes without force.
    last_verified_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    last_verify_healthy: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    last_verify_location: Mapped[str | None] = mapped_column(String(1000), nullable=True)
    # The recorded canary (contract.canary.CanaryRecord as JSON): None until `lifeline catalog canary record`.
    canary: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    canary_recorded_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    canary_recorded_by: Mapped[str | None] = mapped_column(String(160), nullable=True)

    shards: Mapped[list[Shard]] = relationship(
        back_populates="weight_version", order_by="Shard.path", cascade="all, delete-orphan"
    )
    issues: Mapped[list[KnownIssue]] = relationship(
        back_populates="weight_version", order_by="KnownIssue.id", cascade="all, delete-orphan"
    )


class Shard(Base):
    __tablename__ = "weight_shards"
    __table_args__ = (UniqueConstraint("version_id", "path"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("weight_versions.id", ondelete="CASCADE"), index=True)
    path: Mapped[str] = mapped_column(String(1000))
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))

    weight_version: Mapped[WeightVersion] = relationship(back_populates="shards")


class KnownIssue(Base):
    __tablename__ = "known_issues"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("weight_versions.id", ondelete="CASCADE"), index=True)
    severity: Mapped[str] = mapped_column(String(16))
    title: Mapped[str] = mapped_column(String(400))
    description: Mapped[str] = mapped_column(Text, default="")
    opened_by: Mapped[str] = mapped_column(String(160))
    opened_at: Mapped[datetime] = mapped_column(UTCDateTime())
    resolved_by: Mapped[str | None] = mapped_column(String(160), nullable=True)
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    resolution: Mapped[str | None] = mapped_column(Text, nullable=True)

    weight_version: Mapped[WeightVersion] = relationship(back_populates="issues")


class Alias(Base):
    """Where an alias points now. `revision` is the compare-and-set token."""

    __tablename__ = "aliases"
    __table_args__ = (UniqueConstraint("model", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(128), index=True)
    name: Mapped[str] = mapped_column(String(128))
    version_id: Mapped[int] = mapped_column(ForeignKey("weight_versions.id", ondelete="RESTRICT"))
    revision: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class AliasMove(Base):
    """Every move an alias ever made, oldest first by id."""

    __tablename__ = "alias_moves"
    __table_args__ = (Index("ix_alias_moves_model_alias", "model", "alias"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(128))
    alias: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(16))
    from_version_id: Mapped[int | None] = mapped_column(ForeignKey("weight_versions.id"), nullable=True)
    to_version_id: Mapped[int] = mapped_column(ForeignKey("weight_versions.id"))
    revision: Mapped[int] = mapped_column(Integer)
    forced: Mapped[bool] = mapped_column(Boolean, default=False)
    actor: Mapped[str] = mapped_column(String(160))
    reason: Mapped[str] = mapped_column(Text)
    moved_at: Mapped[datetime] = mapped_column(UTCDateTime())
    event_id: Mapped[int | None] = mapped_column(ForeignKey("events.id"), nullable=True)
