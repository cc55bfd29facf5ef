"""Replication policies (one row per model and session class, versioned) and what replication did.

A policy row changes only by compare-and-set on `revision`; every change is an
event (`replication.policy`). `replication_status` is one row per policy that
the workers update with atomic increments (never read-modify-write), and
`replication_dead_letters` holds the checkpoints a worker gave up on after
the policy's attempts, for an operator to see (status API, event log) and to
retry or clear (`states.py`).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import CheckConstraint, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, UTCDateTime


class ReplicationPolicy(Base):
    __tablename__ = "replication_policies"
    __table_args__ = (
        UniqueConstraint("model", "session_class"),
        CheckConstraint("mode IN ('rebuildable', 'interactive', 'critical')", name="mode"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(128))
    session_class: Mapped[str] = mapped_column(String(64))
    mode: Mapped[str] = mapped_column(String(16))
    # interactive: a checkpoint every N turns or every T seconds, whichever comes first (the engine and the
    # gateway checkpoint; replication sweeps an interactive policy every `every_seconds`).
    every_turns: Mapped[int | None] = mapped_column(Integer, nullable=True)
    every_seconds: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The declared RPO_context: at most this much context (seconds, and turns where given) without a valid
    # checkpoint at the standby. Declared here; measured by the region-loss test.
    rpo_context_seconds: Mapped[int] = mapped_column(Integer)
    rpo_context_turns: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Store URLs as given (the worker needs the credentials); never answered back unredacted.
    source_store: Mapped[str | None] = mapped_column(Text, nullable=True)  # None: rebuildable
    destination_store: Mapped[str | None] = mapped_column(Text, nullable=True)
    retention_seconds: Mapped[int] = mapped_column(Integer)
    max_attempts: Mapped[int] = mapped_column(Integer)
    revision: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(Text)
    updated_by: Mapped[str] = mapped_column(String(160))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class ReplicationStatus(Base):
    __tablename__ = "replication_status"

    policy_id: Mapped[int] = mapped_column(ForeignKey("replication_policies.id", ondelete="CASCADE"),
                                           primary_key=True)
    last_sweep_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # As of the last sweep: checkpoints at the source the destination lacks, and the oldest one's creation
    # time (Unix seconds), from which the status API computes the current lag at read time.
    pending: Mapped[int] = mapped_column(Integer, default=0)
    oldest_pending_created_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    replicated_total: Mapped[int] = mapped_column(Integer, default=0)
    blocks_copied_total: Mapped[int] = mapped_column(Integer, default=0)
    deleted_total: Mapped[int] = mapped_column(Integer, default=0)
    last_replicated_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # Seconds from the last replicated checkpoint's creation at the source to its verified presence here.
    last_lag_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)


class ReplicationDeadLetter(Base):
    __tablename__ = "replication_dead_letters"
    __table_args__ = (
        UniqueConstraint("policy_id", "checkpoint_key"),
        CheckConstraint("state IN ('dead', 'retrying', 'cleared')", name="state"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    policy_id: Mapped[int] = mapped_column(ForeignKey("replication_policies.id", ondelete="CASCADE"), index=True)
    checkpoint_key: Mapped[str] = mapped_column(String(300))
    attempts: Mapped[int] = mapped_column(Integer)
    error: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # controlplane.replication.states: dead | retrying | cleared (migration 0016); changed by compare-and-set.
    state: Mapped[str] = mapped_column(String(16), default="dead", server_default="dead")
    state_changed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    state_changed_by: Mapped[str | None] = mapped_column(String(160), nullable=True)
