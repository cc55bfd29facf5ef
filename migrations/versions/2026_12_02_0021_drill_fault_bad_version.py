"""a drill may replace an instance with another version's weights under the same name (`bad_version`)

`drill_definitions.fault` gains `bad_version`: the instance is started again
from the weights of another version, still answering to the model's name
(what a rollout that shipped the wrong build does). Nothing in the request
path can tell; the agent's canary must, and the drill measures how fast.

The same rebuild as 0020 (SQLite keeps the constraint in the table
definition; migrations/env.py checks every foreign key before it commits).
A downgrade refuses while a `bad_version` definition exists.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-02 19:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD = ("fault IN ('sigkill', 'sigstop', 'hang', 'corrupt_weights', 'zone_loss', 'region_loss', "
       "'controlplane_down', 'redis_down')")
NEW = ("fault IN ('sigkill', 'sigstop', 'hang', 'corrupt_weights', 'bad_version', 'zone_loss', "
       "'region_loss', 'controlplane_down', 'redis_down')")


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
    count = op.get_bind().execute(sa.text("SELECT count(*) FROM drill_definitions WHERE fault = 'bad_version'")
                                  ).scalar()
    if count:
        raise RuntimeError(f"{count} drill definition(s) inject bad_version, which revision 0020 cannot hold; "
                           "their runs keep them, so they are not deleted here: export and remove them first")
    _swap(OLD)
