"""a drill run of an instance names the generation it faulted

`drill_runs.fault_generation`: the endpoint generation of the instance an
instance drill faulted, as the engine reported it before the fault (the
reference engine's `GET /healthz/generation`). Its `drill.started` and
`drill.aborted` events carry it in `after.generation`, so the log says
which incarnation of `fault_target` was judged. NULL: not an instance
drill, or an engine that does not report it (stock vLLM).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02 00:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("drill_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("fault_generation", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("drill_runs", schema=None) as batch_op:
        batch_op.drop_column("fault_generation")
