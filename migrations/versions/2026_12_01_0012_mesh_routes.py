"""mesh routes: a model's version and zone weights per header cohort, for the mesh tier

Issue 11's mesh tier in Lifeline's own gateways (cutover/models.py
`MeshRouteRecord`, contract/mesh.py): the control plane publishes these in
the routing snapshot and gateways split a bare model name's requests by
them (prod / canary / shadow cohorts, 99/1 splits). `region` and `cohort`
are `*` for every region / the default route, so the unique key holds on
both databases without NULL semantics.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 08:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "mesh_routes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("region", sa.String(length=128), nullable=False),
        sa.Column("cohort", sa.String(length=64), nullable=False),
        sa.Column("destinations", sa.JSON(), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("updated_by", sa.String(length=160), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_mesh_routes")),
        sa.UniqueConstraint("model", "region", "cohort", name=op.f("uq_mesh_routes_model_region_cohort")),
    )


def downgrade() -> None:
    op.drop_table("mesh_routes")
