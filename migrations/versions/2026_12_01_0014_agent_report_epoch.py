"""agent reports name the control-plane epoch of the snapshot they applied

As `gateway_reports.snapshot_epoch` (0011): a snapshot version counts only
within the database that issued it, so an agent's version is shown as
foreign when it came from another epoch. NULL: an agent from before epochs,
or no snapshot yet.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01 08:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("agent_reports", schema=None) as batch_op:
        batch_op.add_column(sa.Column("snapshot_epoch", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("agent_reports", schema=None) as batch_op:
        batch_op.drop_column("snapshot_epoch")
