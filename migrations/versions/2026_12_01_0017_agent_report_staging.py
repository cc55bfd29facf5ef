"""agent reports carry a cold-tier pool's staging check per version

`AgentReport.staging` (contract/events.py): per version of a cold-tier
pool, whether its staged artifacts matched the catalog at the agent's last
check (verified | missing | mismatch, the shard named). NULL: the agent runs
no cold-tier pool, or predates the check.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-01 14:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("agent_reports", schema=None) as batch_op:
        batch_op.add_column(sa.Column("staging", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("agent_reports", schema=None) as batch_op:
        batch_op.drop_column("staging")
