"""drill definitions (versioned) and drill runs (one state machine row each)

`drill_definitions` are immutable: a new version of a name is a new row.
`drill_runs` move by compare-and-set on (state, revision) through
scheduled → awaiting_approval → running → measuring → passed | failed |
aborted, and keep the run's report (JSON) that the SLO export cites.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30 15:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "drill_definitions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("fault", sa.String(length=32), nullable=False),
        sa.Column("region", sa.String(length=128), nullable=False),
        sa.Column("blast_radius", sa.JSON(), nullable=False),
        sa.Column("stop_conditions", sa.JSON(), nullable=False),
        sa.Column("expected_tier", sa.String(length=16), nullable=False),
        sa.Column("targets", sa.JSON(), nullable=False),
        sa.Column("traffic", sa.JSON(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(length=160), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("scope IN ('instance', 'zone', 'region')", name=op.f("ck_drill_definitions_scope")),
        sa.CheckConstraint(
            "fault IN ('sigkill', 'hang', 'corrupt_weights', 'zone_loss', 'region_loss', "
            "'controlplane_down', 'redis_down')",
            name=op.f("ck_drill_definitions_fault"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_drill_definitions")),
        sa.UniqueConstraint("name", "version", name=op.f("uq_drill_definitions_name_version")),
    )
    op.create_index(op.f("ix_drill_definitions_name"), "drill_definitions", ["name"])
    op.create_index(op.f("ix_drill_definitions_model"), "drill_definitions", ["model"])
    op.create_table(
        "drill_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("definition_id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=24), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("trigger", sa.String(length=16), nullable=False),
        sa.Column("requested_by", sa.String(length=160), nullable=False),
        sa.Column("approved_by", sa.String(length=160), nullable=True),
        sa.Column("approved_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("fault_target", sa.String(length=200), nullable=True),
        sa.Column("abort_reason", sa.Text(), nullable=True),
        sa.Column("failure", sa.Text(), nullable=True),
        sa.Column("report", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "state IN ('scheduled', 'awaiting_approval', 'running', 'measuring', 'passed', 'failed', 'aborted')",
            name=op.f("ck_drill_runs_state"),
        ),
        sa.CheckConstraint("trigger IN ('schedule', 'manual')", name=op.f("ck_drill_runs_trigger")),
        sa.ForeignKeyConstraint(["definition_id"], ["drill_definitions.id"], ondelete="RESTRICT",
                                name=op.f("fk_drill_runs_definition_id_drill_definitions")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_drill_runs")),
    )
    op.create_index(op.f("ix_drill_runs_definition_id"), "drill_runs", ["definition_id"])
    op.create_index(op.f("ix_drill_runs_model"), "drill_runs", ["model"])
    op.create_index(op.f("ix_drill_runs_state"), "drill_runs", ["state"])
    op.create_index(op.f("ix_drill_runs_ended_at"), "drill_runs", ["ended_at"])


def downgrade() -> None:
    op.drop_table("drill_runs")
    op.drop_table("drill_definitions")
