"""name the zone-fault tier `anycast` in the event log, as invariant 8 does

Migration 0001 allowed `routing_tier` in ('l7', 'mesh', 'zone', 'dns') while
the design, the contract (`contract.events`) and the cutover drivers call
the tier `anycast`; the control plane translated one into the other on the
way in. The check constraint now names `anycast` and the translation is
gone, so a post-mortem query for `routing_tier=anycast` finds what the
anycast tier did.

Events are append-only (0003, 0004), so rows already stored as `zone`
cannot be rewritten: the upgrade refuses to run while any exist and says
so. Nothing released wrote them.

On SQLite the constraint lives in the table definition, so the table is
rebuilt (batch move-and-copy), which drops its triggers: they are created
again here, as 0003's docstring asks.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30 16:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NEW = "routing_tier IS NULL OR routing_tier IN ('l7', 'mesh', 'anycast', 'dns')"
OLD = "routing_tier IS NULL OR routing_tier IN ('l7', 'mesh', 'zone', 'dns')"


def _refuse_if_any(tier: str) -> None:
    count = op.get_bind().execute(sa.text("SELECT count(*) FROM events WHERE routing_tier = :t"), {"t": tier}).scalar()
    if count:
        raise RuntimeError(f"{count} event(s) carry routing_tier={tier!r}; the event log is append-only, so they "
                           "cannot be renamed: export them (lifeline controlplane events export) before migrating")


def _swap(old: str, new: str) -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint(op.f("ck_events_routing_tier"), "events", type_="check")
        op.create_check_constraint(op.f("ck_events_routing_tier"), "events", new)
        return
    from importlib import import_module

    append_only = import_module("migrations.versions.2026_11_30_0003_events_append_only")
    refuse_replace = import_module("migrations.versions.2026_11_30_0004_events_refuse_replace")
    with op.batch_alter_table("events", recreate="always") as batch:
        batch.drop_constraint(op.f("ck_events_routing_tier"), type_="check")
        batch.create_check_constraint(op.f("ck_events_routing_tier"), new)
    for statement in append_only.SQLITE_TRIGGERS:
        op.execute(statement)
    op.execute(refuse_replace.SQLITE_TRIGGER)


def upgrade() -> None:
    _refuse_if_any("zone")
    _swap(OLD, NEW)


def downgrade() -> None:
    _refuse_if_any("anycast")
    _swap(NEW, OLD)
