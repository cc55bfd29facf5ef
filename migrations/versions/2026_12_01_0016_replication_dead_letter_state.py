"""replication dead letters get a state: dead | retrying | cleared (issue 12)

An operator retries a dead letter (`retrying`: the next sweep plans it again
and its copy gets the policy's attempts afresh; a verified copy deletes the
row, a last failure makes it `dead` again) or clears it (`cleared`: no
longer reported, and sweeps still skip it, so a checkpoint that cannot be
copied is not dead-lettered again and again). Existing rows are `dead`.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01 10:15:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("replication_dead_letters", schema=None) as batch_op:
        batch_op.add_column(sa.Column("state", sa.String(length=16), nullable=False, server_default="dead"))
        batch_op.add_column(sa.Column("state_changed_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("state_changed_by", sa.String(length=160), nullable=True))
        batch_op.create_check_constraint(op.f("ck_replication_dead_letters_state"), "state IN ('dead', 'retrying', 'cleared')")


def downgrade() -> None:
    with op.batch_alter_table("replication_dead_letters", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("ck_replication_dead_letters_state"), type_="check")
        batch_op.drop_column("state_changed_by")
        batch_op.drop_column("state_changed_at")
        batch_op.drop_column("state")
