"""keep the last report of each region's agent

`PUT /api/v1/agents/{region}` stores a `contract.events.AgentReport` per
region (one row, replaced by newer reports); `GET /api/v1/agents` reads them
back with a staleness computed from `received_at`.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 07:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "agent_reports",
        sa.Column("region", sa.String(length=128), nullable=False),
        sa.Column("agent_id", sa.String(length=160), nullable=False),
        sa.Column("snapshot_version", sa.Integer(), nullable=True),
        sa.Column("instances", sa.JSON(), nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reported_by", sa.String(length=160), nullable=False),
        sa.PrimaryKeyConstraint("region", name=op.f("pk_agent_reports")),
    )


def downgrade() -> None:
    op.drop_table("agent_reports")
