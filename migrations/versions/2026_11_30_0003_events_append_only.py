"""make the event log append-only in the database

No route updates or deletes events, but any code path, script or psql
session could. Triggers now refuse UPDATE and DELETE on `events` on both
backends, so the log holds even against code that bypasses the service.

Both raise an integrity error (SQLSTATE 23000 on PostgreSQL, SQLite's
RAISE(ABORT) is a constraint error), so SQLAlchemy reports the same
IntegrityError on either backend.

Not covered, on purpose: TRUNCATE on PostgreSQL (row triggers do not
fire on it; the test fixtures empty tables that way) and DROP TABLE. A
production database should also withhold UPDATE, DELETE and TRUNCATE on
`events` from the service's role; that is a grant, not a migration.

SQLite keeps triggers with the table, but a later batch migration that
recreates `events` (move-and-copy) drops them: such a migration must
create them again (see `create_triggers` below).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 11:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MESSAGE = "events are append-only"

POSTGRES_FUNCTION = f"""
CREATE FUNCTION lifeline_events_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '{MESSAGE}: % refused on event %', TG_OP, OLD.id
        USING ERRCODE = 'integrity_constraint_violation';
END
$$
"""

POSTGRES_TRIGGER = """
CREATE TRIGGER events_append_only
BEFORE UPDATE OR DELETE ON events
FOR EACH ROW EXECUTE FUNCTION lifeline_events_append_only()
"""

SQLITE_TRIGGERS = [
    f"""
    CREATE TRIGGER events_no_update BEFORE UPDATE ON events
    BEGIN SELECT RAISE(ABORT, '{MESSAGE}: UPDATE refused'); END
    """,
    f"""
    CREATE TRIGGER events_no_delete BEFORE DELETE ON events
    BEGIN SELECT RAISE(ABORT, '{MESSAGE}: DELETE refused'); END
    """,
]


def create_triggers() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(POSTGRES_FUNCTION)
        op.execute(POSTGRES_TRIGGER)
    else:
        for statement in SQLITE_TRIGGERS:
            op.execute(statement)


def upgrade() -> None:
    create_triggers()


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS events_append_only ON events")
        op.execute("DROP FUNCTION IF EXISTS lifeline_events_append_only()")
    else:
        op.execute("DROP TRIGGER IF EXISTS events_no_update")
        op.execute("DROP TRIGGER IF EXISTS events_no_delete")
