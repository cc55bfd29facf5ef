"""record each weight version's canary in the catalog

`lifeline catalog canary record` keeps the greedy output of a verified
instance for a fixed prompt (`contract.canary.CanaryRecord`, as JSON) on
the version, with when and by whom; the snapshot carries it to the regional
agents (`VersionEntry.canary`). NULL means none recorded: agents then use
their canary file, or check health without a canary.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 08:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("weight_versions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("canary", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("canary_recorded_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("canary_recorded_by", sa.String(length=160), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("weight_versions", schema=None) as batch_op:
        batch_op.drop_column("canary_recorded_by")
        batch_op.drop_column("canary_recorded_at")
        batch_op.drop_column("canary")
