"""cutovers, their steps, the cutover stop switch and zonal shifts

Issue 11's workflow half (cutover/models.py). One active cutover per scope
and one active zonal shift per zone are partial unique indexes, the same
DDL on SQLite and PostgreSQL, so when two runners race the database
decides. `cutover_gate` is not seeded: no row means the stop switch is off,
and the first write creates row 1.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30 14:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ACTIVE_CUTOVER = "state IN ('executing', 'verifying', 'rolling_back')"
ACTIVE_SHIFT = "ended_at IS NULL"


def upgrade() -> None:
    op.create_table(
        "cutovers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("scope_kind", sa.String(length=16), nullable=False),
        sa.Column("region", sa.String(length=128), nullable=False),
        sa.Column("scope_name", sa.String(length=128), nullable=False),
        sa.Column("scope", sa.String(length=400), nullable=False),
        sa.Column("tier", sa.String(length=8), nullable=False),
        sa.Column("target_state", sa.String(length=8), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("evidence", sa.JSON(), nullable=True),
        sa.Column("planned_by", sa.String(length=160), nullable=False),
        sa.Column("executed_by", sa.String(length=160), nullable=True),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("break_glass", sa.Boolean(), nullable=False),
        sa.Column("break_glass_reason", sa.Text(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("runner", sa.String(length=64), nullable=True),
        sa.Column("claimed_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("failure", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "state IN ('planned', 'executing', 'verifying', 'completed', 'rolling_back', 'rolled_back', 'failed')",
            name=op.f("ck_cutovers_state"),
        ),
        sa.CheckConstraint("scope_kind IN ('instance', 'zone', 'region')", name=op.f("ck_cutovers_scope_kind")),
        sa.CheckConstraint("tier IN ('l7', 'mesh', 'anycast', 'dns')", name=op.f("ck_cutovers_tier")),
        sa.CheckConstraint("target_state IN ('out', 'in')", name=op.f("ck_cutovers_target_state")),
        sa.CheckConstraint("mode IN ('manual', 'automatic')", name=op.f("ck_cutovers_mode")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cutovers")),
    )
    op.create_index(op.f("ix_cutovers_region"), "cutovers", ["region"], unique=False)
    op.create_index(op.f("ix_cutovers_scope"), "cutovers", ["scope"], unique=False)
    op.create_index(op.f("ix_cutovers_state"), "cutovers", ["state"], unique=False)
    op.create_index("uq_cutovers_active_scope", "cutovers", ["scope"], unique=True,
                    sqlite_where=sa.text(ACTIVE_CUTOVER), postgresql_where=sa.text(ACTIVE_CUTOVER))

    op.create_table(
        "cutover_steps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cutover_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("tier", sa.String(length=8), nullable=False),
        sa.Column("driver", sa.String(length=64), nullable=False),
        sa.Column("driver_target", sa.String(length=400), nullable=False),
        sa.Column("expected_before", sa.JSON(), nullable=False),
        sa.Column("expected_after", sa.JSON(), nullable=False),
        sa.Column("actual_before", sa.JSON(), nullable=True),
        sa.Column("timeout_s", sa.Float(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.Column("evidence", sa.JSON(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revert_evidence", sa.JSON(), nullable=True),
        sa.Column("revert_started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revert_ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["cutover_id"], ["cutovers.id"], name=op.f("fk_cutover_steps_cutover_id_cutovers"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cutover_steps")),
        sa.UniqueConstraint("cutover_id", "position", name=op.f("uq_cutover_steps_cutover_id_position")),
    )
    op.create_index(op.f("ix_cutover_steps_cutover_id"), "cutover_steps", ["cutover_id"], unique=False)

    op.create_table(
        "cutover_gate",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("stopped", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("actor", sa.String(length=160), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cutover_gate")),
    )

    op.create_table(
        "zonal_shifts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("region", sa.String(length=128), nullable=False),
        sa.Column("zone", sa.String(length=128), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("actor", sa.String(length=160), nullable=False),
        sa.Column("cutover_id", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_reason", sa.String(length=16), nullable=True),
        sa.Column("ended_by", sa.String(length=160), nullable=True),
        sa.CheckConstraint("end_reason IS NULL OR end_reason IN ('expired', 'cancelled', 'failed')",
                           name=op.f("ck_zonal_shifts_end_reason")),
        sa.ForeignKeyConstraint(["cutover_id"], ["cutovers.id"], name=op.f("fk_zonal_shifts_cutover_id_cutovers"),
                                ondelete="RESTRICT"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_zonal_shifts")),
    )
    op.create_index(op.f("ix_zonal_shifts_cutover_id"), "zonal_shifts", ["cutover_id"], unique=False)
    op.create_index(op.f("ix_zonal_shifts_expires_at"), "zonal_shifts", ["expires_at"], unique=False)
    op.create_index("uq_zonal_shifts_active_zone", "zonal_shifts", ["region", "zone"], unique=True,
                    sqlite_where=sa.text(ACTIVE_SHIFT), postgresql_where=sa.text(ACTIVE_SHIFT))


def downgrade() -> None:
    op.drop_index("uq_zonal_shifts_active_zone", table_name="zonal_shifts")
    op.drop_index(op.f("ix_zonal_shifts_expires_at"), table_name="zonal_shifts")
    op.drop_index(op.f("ix_zonal_shifts_cutover_id"), table_name="zonal_shifts")
    op.drop_table("zonal_shifts")
    op.drop_table("cutover_gate")
    op.drop_index(op.f("ix_cutover_steps_cutover_id"), table_name="cutover_steps")
    op.drop_table("cutover_steps")
    op.drop_index("uq_cutovers_active_scope", table_name="cutovers")
    op.drop_index(op.f("ix_cutovers_state"), table_name="cutovers")
    op.drop_index(op.f("ix_cutovers_scope"), table_name="cutovers")
    op.drop_index(op.f("ix_cutovers_region"), table_name="cutovers")
    op.drop_table("cutovers")
