from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from sqlalchemy import ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, UTCDateTime


class ClusterState(StrEnum):
    ACTIVE = "active"  # takes new requests at its weight
    DRAINING = "draining"  # finishes in-flight requests, takes no new ones
    EJECTED = "ejected"  # out of routing entirely


class Region(Base):
    __tablename__ = "regions"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    description: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class Zone(Base):
    __tablename__ = "zones"
    __table_args__ = (UniqueConstraint("region", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    region: Mapped[str] = mapped_column(ForeignKey("regions.name", ondelete="RESTRICT"), index=True)
    name: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class ServingCluster(Base):
    """A pool of engines serving one model in one region (optionally one zone)."""

    __tablename__ = "serving_clusters"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    region: Mapped[str] = mapped_column(ForeignKey("regions.name", ondelete="RESTRICT"), index=True)
    zone: Mapped[str | None] = mapped_column(String(128), nullable=True)
    model: Mapped[str] = mapped_column(String(128), index=True)
    endpoint: Mapped[str] = mapped_column(String(1000), default="")
    weight: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))
    revision: Mapped[int] = mapped_column(Integer, default=1)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class InstanceEjection(Base):
    """The control plane's order to route nothing to one endpoint generation."""

    __tablename__ = "instance_ejections"
    __table_args__ = (UniqueConstraint("region", "instance_id", "generation"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    region: Mapped[str] = mapped_column(ForeignKey("regions.name", ondelete="RESTRICT"), index=True)
    instance_id: Mapped[str] = mapped_column(String(128))
    generation: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(Text)
    actor: Mapped[str] = mapped_column(String(160))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
