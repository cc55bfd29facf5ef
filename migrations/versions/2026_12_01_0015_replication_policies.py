"""replication policies, their status and dead letters (KV checkpoint replication, issue 12)

`replication_policies`: per model and session class, `rebuildable` |
`interactive` | `critical`, a declared RPO_context, source and destination
store URLs, a retention; changed by compare-and-set on `revision`.
`replication_status`: one row per policy, updated by the Celery workers with
atomic increments. `replication_dead_letters`: checkpoints a worker gave up
on after the policy's attempts.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01 08:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "replication_policies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("session_class", sa.String(length=64), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("every_turns", sa.Integer(), nullable=True),
        sa.Column("every_seconds", sa.Integer(), nullable=True),
        sa.Column("rpo_context_seconds", sa.Integer(), nullable=False),
        sa.Column("rpo_context_turns", sa.Integer(), nullable=True),
        sa.Column("source_store", sa.Text(), nullable=True),
        sa.Column("destination_store", sa.Text(), nullable=True),
        sa.Column("retention_seconds", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("updated_by", sa.String(length=160), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("mode IN ('rebuildable', 'interactive', 'critical')",
                           name=op.f("ck_replication_policies_mode")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_replication_policies")),
        sa.UniqueConstraint("model", "session_class", name=op.f("uq_replication_policies_model_session_class")),
    )
    op.create_table(
        "replication_status",
        sa.Column("policy_id", sa.Integer(), nullable=False),
        sa.Column("last_sweep_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("pending", sa.Integer(), nullable=False),
        sa.Column("oldest_pending_created_at", sa.Float(), nullable=True),
        sa.Column("replicated_total", sa.Integer(), nullable=False),
        sa.Column("blocks_copied_total", sa.Integer(), nullable=False),
        sa.Column("deleted_total", sa.Integer(), nullable=False),
        sa.Column("last_replicated_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_lag_seconds", sa.Float(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["policy_id"], ["replication_policies.id"], ondelete="CASCADE",
                                name=op.f("fk_replication_status_policy_id_replication_policies")),
        sa.PrimaryKeyConstraint("policy_id", name=op.f("pk_replication_status")),
    )
    op.create_table(
        "replication_dead_letters",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("policy_id", sa.Integer(), nullable=False),
        sa.Column("checkpoint_key", sa.String(length=300), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["policy_id"], ["replication_policies.id"], ondelete="CASCADE",
                                name=op.f("fk_replication_dead_letters_policy_id_replication_policies")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_replication_dead_letters")),
        sa.UniqueConstraint("policy_id", "checkpoint_key",
                            name=op.f("uq_replication_dead_letters_policy_id_checkpoint_key")),
    )
    op.create_index(op.f("ix_replication_dead_letters_policy_id"), "replication_dead_letters", ["policy_id"])


def downgrade() -> None:
    op.drop_table("replication_dead_letters")
    op.drop_table("replication_status")
    op.drop_table("replication_policies")
