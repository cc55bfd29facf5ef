"""Alertmanager deliveries, acted on once each; a drill run may be requested by an alert

`alert_deliveries` keeps one row per alert (fingerprint, start, status):
the first delivery claims it and acts, Alertmanager's retries and repeats
find it claimed (controlplane/alerts). `drill_runs.trigger` gains `alert`.
The drill_runs rebuild on SQLite is the batch move-and-copy of 0020. A
downgrade refuses while a run was triggered by an alert.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-02 20:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_TRIGGER = "trigger IN ('schedule', 'manual')"
NEW_TRIGGER = "trigger IN ('schedule', 'manual', 'alert')"


def _trigger(check: str) -> None:
    name = op.f("ck_drill_runs_trigger")
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint(name, "drill_runs", type_="check")
        op.create_check_constraint(name, "drill_runs", check)
        return
    with op.batch_alter_table("drill_runs", recreate="always") as batch:
        batch.drop_constraint(name, type_="check")
        batch.create_check_constraint(name, check)


def upgrade() -> None:
    op.create_table(
        "alert_deliveries",
        sa.Column("key", sa.String(400), primary_key=True),
        sa.Column("alertname", sa.String(200), nullable=False, index=True),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("outcome", sa.String(32), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=True),
        sa.Column("deliveries", sa.Integer(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("state IN ('acting', 'done')", name=op.f("ck_alert_deliveries_state")),
    )
    _trigger(NEW_TRIGGER)


def downgrade() -> None:
    count = op.get_bind().execute(sa.text("SELECT count(*) FROM drill_runs WHERE trigger = 'alert'")).scalar()
    if count:
        raise RuntimeError(f"{count} drill run(s) were requested by an alert, which revision 0021 cannot hold")
    _trigger(OLD_TRIGGER)
    op.drop_table("alert_deliveries")
