"""The `mesh_routes` table (migration 0012)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, UTCDateTime

ANY = "*"  # mesh_routes.region: every region; mesh_routes.cohort: the default route


class MeshRouteRecord(Base):
    """One mesh route (contract.mesh.MeshRoute): a model's version/zone weights for one cohort in one region.

    Desired routing state like a cluster: every write bumps the routing
    version in the same transaction, so the snapshot carries it. `region`
    and `cohort` are `*` for "every region" and "the default route" (a
    unique key cannot hold NULLs as equal on both databases).
    """

    __tablename__ = "mesh_routes"
    __table_args__ = (UniqueConstraint("model", "region", "cohort"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(128))
    region: Mapped[str] = mapped_column(String(128))
    cohort: Mapped[str] = mapped_column(String(64))
    # [{"version", "zone", "weight"}], as contract.mesh.MeshDestination
    destinations: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    revision: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(Text)
    updated_by: Mapped[str] = mapped_column(String(160))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
