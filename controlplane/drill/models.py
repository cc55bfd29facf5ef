"""Drill definitions (versioned, immutable) and drill runs (one state machine row each).

A definition is never edited: defining the same name again adds the next
version, so a run's report always names exactly what was drilled. A run row
changes only by compare-and-set on `(state, revision)`; its report is written
in the same update that ends it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, CheckConstraint, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from controlplane.db import Base, UTCDateTime


class DrillDefinition(Base):
    __tablename__ = "drill_definitions"
    __table_args__ = (
        UniqueConstraint("name", "version"),
        CheckConstraint("scope IN ('instance', 'zone', 'region')", name="scope"),
        CheckConstraint(
            "fault IN ('sigkill', 'sigstop', 'hang', 'corrupt_weights', 'bad_version', 'zone_loss', "
            "'region_loss', 'controlplane_down', 'redis_down')",
            name="fault",
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), index=True)
    version: Mapped[int] = mapped_column(Integer)
    # The alias or weight version clients name; the SLO document of that model cites this drill.
    model: Mapped[str] = mapped_column(String(128), index=True)
    scope: Mapped[str] = mapped_column(String(16))
    fault: Mapped[str] = mapped_column(String(32))
    region: Mapped[str] = mapped_column(String(128))
    # {"instances": [...], "zones": [...], "max_instances": n}: nothing outside it is ever faulted.
    blast_radius: Mapped[dict[str, Any]] = mapped_column(JSON)
    # {"max_error_rate": x, "ttft_p99_ms": y, "min_requests": n}: beyond a bound → abort and roll back.
    stop_conditions: Mapped[dict[str, Any]] = mapped_column(JSON)
    # The routing tier expected to act ("l7", "mesh", "zone"/"anycast", "dns").
    expected_tier: Mapped[str] = mapped_column(String(16))
    # {"rto_latency_s", "rto_quality_s", "request_rto_s", "token_rpo_tokens", "rpo_context_tokens", "rpo_weight_versions", …}
    targets: Mapped[dict[str, Any]] = mapped_column(JSON)
    # Traffic shape: {"requests": n, "concurrency": c, "max_tokens": m, "prompt": "..."}
    traffic: Mapped[dict[str, Any]] = mapped_column(JSON)
    description: Mapped[str] = mapped_column(Text, default="")
    created_by: Mapped[str] = mapped_column(String(160))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class DrillRun(Base):
    __tablename__ = "drill_runs"
    __table_args__ = (
        CheckConstraint(
            "state IN ('scheduled', 'awaiting_approval', 'running', 'measuring', 'passed', 'failed', 'aborted')",
            name="state",
        ),
        CheckConstraint("trigger IN ('schedule', 'manual', 'alert')", name="trigger"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    definition_id: Mapped[int] = mapped_column(ForeignKey("drill_definitions.id", ondelete="RESTRICT"), index=True)
    # Copied from the definition so the SLO export and the cadence query read one table.
    model: Mapped[str] = mapped_column(String(128), index=True)
    scope: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(24), index=True)
    revision: Mapped[int] = mapped_column(Integer, default=1)
    trigger: Mapped[str] = mapped_column(String(16))
    requested_by: Mapped[str] = mapped_column(String(160))
    approved_by: Mapped[str | None] = mapped_column(String(160), nullable=True)
    approved_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # The instance (or zone) the runner chose inside the blast radius.
    fault_target: Mapped[str | None] = mapped_column(String(200), nullable=True)
    # An instance drill: the faulted instance's generation as its engine reported it before the fault; else None.
    fault_generation: Mapped[int | None] = mapped_column(Integer, nullable=True)
    abort_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    failure: Mapped[str | None] = mapped_column(Text, nullable=True)
    report: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True, index=True)

    definition: Mapped[DrillDefinition] = relationship(lazy="joined")
