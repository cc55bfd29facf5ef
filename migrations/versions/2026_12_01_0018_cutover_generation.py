"""cutovers of an instance name the generation they act on

`cutovers.generation`: the endpoint generation an instance-scope cutover
was planned for (l7 ejects `(instance_id, generation)` through the
snapshot). Each of the cutover's events carries it in `after.generation`,
so a post-mortem can tell which incarnation of the instance a cutover
judged; before, only the snapshot step's target string said so, and the
plan, transition, HAProxy step and escalation events did not. NULL: not an
instance scope, or planned without one.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-01 23:55:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("cutovers", schema=None) as batch_op:
        batch_op.add_column(sa.Column("generation", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cutovers", schema=None) as batch_op:
        batch_op.drop_column("generation")
