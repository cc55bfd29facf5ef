"""Cutovers, their steps, the global stop switch and zonal shifts.

A cutover row is changed only by compare-and-set on `(state, revision)`
(`repository.compare_and_set`); its steps are written only by the runner
that holds the cutover's claim, in the same transaction as a claim renewal,
so a runner that lost its claim cannot write a step. A step's states are
typed (`cutover.drivers.step.StepState`) in Python and JSON in the row:
`StepStateJSON` is the one place that JSON is parsed.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

from controlplane.db import Base, UTCDateTime
from cutover.drivers.step import StepState, parse_step_state


class StepStateJSON(TypeDecorator[StepState]):
    """A step's state: the typed model in Python, its `model_dump(mode="json")` in the row.

    Parsed on load, here and nowhere else, so every reader of a step (the
    runner, the API, the CLI, the console) holds the typed state; the JSON
    is what every release has stored (cutover/drivers/step.py).
    """

    impl = JSON
    cache_ok = True

    def process_bind_param(self, value: StepState | None, dialect: Any) -> dict[str, Any] | None:
        return None if value is None else value.model_dump(mode="json")

    def process_result_value(self, value: Any, dialect: Any) -> StepState | None:
        return None if value is None else parse_step_state(value)


class CutoverMode(StrEnum):
    MANUAL = "manual"
    AUTOMATIC = "automatic"


ACTIVE_SQL = "state IN ('executing', 'verifying', 'rolling_back')"


class Cutover(Base):
    __tablename__ = "cutovers"
    __table_args__ = (
        CheckConstraint(
            "state IN ('planned', 'executing', 'verifying', 'completed', 'rolling_back', 'rolled_back', 'failed')",
            name="state",
        ),
        CheckConstraint("scope_kind IN ('instance', 'zone', 'region')", name="scope_kind"),
        CheckConstraint("tier IN ('l7', 'mesh', 'anycast', 'dns')", name="tier"),
        CheckConstraint("target_state IN ('out', 'in')", name="target_state"),
        CheckConstraint("mode IN ('manual', 'automatic')", name="mode"),
        # One active cutover per scope, decided by the database when two race.
        Index("uq_cutovers_active_scope", "scope", unique=True,
              sqlite_where=text(ACTIVE_SQL), postgresql_where=text(ACTIVE_SQL)),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    scope_kind: Mapped[str] = mapped_column(String(16))
    region: Mapped[str] = mapped_column(String(128), index=True)
    scope_name: Mapped[str] = mapped_column(String(128))
    # "region:r", "region:r/zone:z", "region:r/instance:i" — the event log's scope.
    scope: Mapped[str] = mapped_column(String(400), index=True)
    tier: Mapped[str] = mapped_column(String(8))
    target_state: Mapped[str] = mapped_column(String(8))
    reason: Mapped[str] = mapped_column(Text)
    mode: Mapped[str] = mapped_column(String(16))
    # Automatic cutovers name the evidence that triggered them.
    evidence: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # An instance scope: the endpoint generation it was planned for (every event of it says so); else None.
    generation: Mapped[int | None] = mapped_column(Integer, nullable=True)
    planned_by: Mapped[str] = mapped_column(String(160))
    executed_by: Mapped[str | None] = mapped_column(String(160), nullable=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    break_glass: Mapped[bool] = mapped_column(Boolean, default=False)
    break_glass_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    state: Mapped[str] = mapped_column(String(16), index=True)
    revision: Mapped[int] = mapped_column(Integer, default=1)
    # The runner holding an active cutover; another may take over once `claimed_until` has passed.
    runner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    claimed_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    failure: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

    steps: Mapped[list[CutoverStep]] = relationship(
        back_populates="cutover", order_by="CutoverStep.position", cascade="all, delete-orphan"
    )


class CutoverStep(Base):
    __tablename__ = "cutover_steps"
    __table_args__ = (UniqueConstraint("cutover_id", "position"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cutover_id: Mapped[int] = mapped_column(ForeignKey("cutovers.id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    tier: Mapped[str] = mapped_column(String(8))
    # Which configured driver of the tier acts (snapshot, haproxy, rfc2136, route53, exabgp, …).
    driver: Mapped[str] = mapped_column(String(64))
    # What the driver acts on, as a label: "cluster=c-eu-a,kind=cluster,region=eu" (drivers.step.describe_target).
    driver_target: Mapped[str] = mapped_column(String(400))
    expected_before: Mapped[StepState] = mapped_column(StepStateJSON())
    expected_after: Mapped[StepState] = mapped_column(StepStateJSON())
    # Read from the tier just before it was changed; what rollback restores.
    actual_before: Mapped[StepState | None] = mapped_column(StepStateJSON(), nullable=True)
    timeout_s: Mapped[float] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16))
    outcome: Mapped[str | None] = mapped_column(String(16), nullable=True)
    evidence: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    revert_evidence: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    revert_started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    revert_ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

    cutover: Mapped[Cutover] = relationship(back_populates="steps")


class CutoverGate(Base):
    """The gating rule: a global stop switch. One row (id=1) once anyone has set it; absent = not stopped."""

    __tablename__ = "cutover_gate"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    stopped: Mapped[bool] = mapped_column(Boolean)
    reason: Mapped[str] = mapped_column(Text)
    actor: Mapped[str] = mapped_column(String(160))
    revision: Mapped[int] = mapped_column(Integer)
    changed_at: Mapped[datetime] = mapped_column(UTCDateTime())


class ZonalShift(Base):
    """A zone taken out of routing until `expires_at` (≤ 72 h), carried out by one cutover.

    Active while `ended_at` is NULL; whether it is due is computed from
    `expires_at` at read time. Ending it (expiry or cancel) rolls its
    cutover back.
    """

    __tablename__ = "zonal_shifts"
    __table_args__ = (
        CheckConstraint("end_reason IS NULL OR end_reason IN ('expired', 'cancelled', 'failed')", name="end_reason"),
        Index("uq_zonal_shifts_active_zone", "region", "zone", unique=True,
              sqlite_where=text("ended_at IS NULL"), postgresql_where=text("ended_at IS NULL")),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    region: Mapped[str] = mapped_column(String(128))
    zone: Mapped[str] = mapped_column(String(128))
    reason: Mapped[str] = mapped_column(Text)
    actor: Mapped[str] = mapped_column(String(160))
    cutover_id: Mapped[int] = mapped_column(ForeignKey("cutovers.id", ondelete="RESTRICT"), index=True)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    end_reason: Mapped[str | None] = mapped_column(String(16), nullable=True)
    ended_by: Mapped[str | None] = mapped_column(String(160), nullable=True)
