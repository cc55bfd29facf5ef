"""a drill may stop an instance's engine (`sigstop`) as well as kill it

`drill_definitions.fault` gains `sigstop`: the instance's engine stops
computing while its process stays (SIGSTOP; on stock vLLM its engine core,
so the API server still answers `/health`), undone by SIGCONT. It is the
stop fault that works on every engine, where `hang` needs the reference
engine's fault admin.

On SQLite the constraint lives in the table definition, so the table is
rebuilt (batch move-and-copy). `drill_runs` references it: migrations/env.py
turns SQLite's foreign-key enforcement off for a migration and checks every
key before it commits, so the rebuild keeps the runs and proves they still
point at their definitions. A downgrade refuses while a `sigstop` definition
exists (runs keep their definition: it cannot be dropped under them).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-02 14:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD = ("fault IN ('sigkill', 'hang', 'corrupt_weights', 'zone_loss', 'region_loss', 'controlplane_down', "
       "'redis_down')")
NEW = ("fault IN ('sigkill', 'sigstop', 'hang', 'corrupt_weights', 'zone_loss', 'region_loss', "
       "'controlplane_down', 'redis_down')")


def _swap(new: str) -> None:
    name = op.f("ck_drill_definitions_fault")
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint(name, "drill_definitions", type_="check")
        op.create_check_constraint(name, "drill_definitions", new)
        return
    with op.batch_alter_table("drill_definitions", recreate="always") as batch:
        batch.drop_constraint(name, type_="check")
        batch.create_check_constraint(name, new)


def upgrade() -> None:
    _swap(NEW)


def downgrade() -> None:
    count = op.get_bind().execute(sa.text("SELECT count(*) FROM drill_definitions WHERE fault = 'sigstop'")).scalar()
    if count:
        raise RuntimeError(f"{count} drill definition(s) inject sigstop, which revision 0019 cannot hold; their "
                           "runs keep them, so they are not deleted here: export and remove them first")
    _swap(OLD)
