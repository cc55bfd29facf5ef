"""record each weight version's last verify

Verify now recomputes the semantic fingerprint besides the shard hashes,
and its outcome is kept on the version: when, where, healthy or not. A
version whose last verify failed is not promoted (or rolled back to)
without force. NULL means never verified, which does not block.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 13:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("weight_versions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("last_verified_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("last_verify_healthy", sa.Boolean(), nullable=True))
        batch_op.add_column(sa.Column("last_verify_location", sa.String(length=1000), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("weight_versions", schema=None) as batch_op:
        batch_op.drop_column("last_verify_location")
        batch_op.drop_column("last_verify_healthy")
        batch_op.drop_column("last_verified_at")
