"""keep the last report of each gateway replica

`PUT /api/v1/gateways/{replica_id}` stores a `contract.events.GatewayReport`
per replica (one row, replaced by newer reports); `GET /api/v1/gateways`
reads them back with a staleness computed from `received_at`.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 14:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gateway_reports",
        sa.Column("replica_id", sa.String(length=160), nullable=False),
        sa.Column("region", sa.String(length=128), nullable=False),
        sa.Column("zone", sa.String(length=128), nullable=False),
        sa.Column("routing_source", sa.String(length=16), nullable=False),
        sa.Column("snapshot_version", sa.Integer(), nullable=True),
        sa.Column("snapshot_applied_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("live_endpoints", sa.JSON(), nullable=False),
        sa.Column("suppressed", sa.Integer(), nullable=False),
        sa.Column("ejected", sa.Integer(), nullable=False),
        sa.Column("reported_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reported_by", sa.String(length=160), nullable=False),
        sa.PrimaryKeyConstraint("replica_id", name=op.f("pk_gateway_reports")),
    )
    with op.batch_alter_table("gateway_reports", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_gateway_reports_region"), ["region"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("gateway_reports", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_gateway_reports_region"))
    op.drop_table("gateway_reports")
