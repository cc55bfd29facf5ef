"""give the control-plane database an epoch; gateways report the epoch they applied

Snapshot versions count up within one database only: a fresh database (a
new demo, a rebuilt control plane) or a restore from backup starts lower,
and a gateway holding a snapshot from the old one refused every new one as
older, while the cutover's L7 verify could take its report of the old,
higher version as proof that it applied the new one.

`snapshot_counter.epoch` is a random uuid made here, once per database (a
restored one gets a new one from `lifeline controlplane epoch rotate`); it
goes into every snapshot and its ETag. `gateway_reports.snapshot_epoch` is
the epoch of the snapshot a replica reports it applied. Downgrading drops
both: the database forgets its epoch, and the next upgrade makes a new one,
which consumers take as another database (it is, as far as they can tell).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 07:00:00
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("snapshot_counter", schema=None) as batch_op:
        batch_op.add_column(sa.Column("epoch", sa.String(length=64), nullable=True))
    op.execute(sa.text("UPDATE snapshot_counter SET epoch = :epoch").bindparams(epoch=str(uuid.uuid4())))
    with op.batch_alter_table("snapshot_counter", schema=None) as batch_op:
        batch_op.alter_column("epoch", existing_type=sa.String(length=64), nullable=False)
    with op.batch_alter_table("gateway_reports", schema=None) as batch_op:
        batch_op.add_column(sa.Column("snapshot_epoch", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gateway_reports", schema=None) as batch_op:
        batch_op.drop_column("snapshot_epoch")
    with op.batch_alter_table("snapshot_counter", schema=None) as batch_op:
        batch_op.drop_column("epoch")
