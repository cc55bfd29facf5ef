"""refuse INSERT OR REPLACE on the event log (SQLite)

Migration 0003 made `events` append-only with triggers on UPDATE and
DELETE. SQLite's `INSERT OR REPLACE INTO events (id, …)` (and `REPLACE
INTO`) still rewrote an existing event: REPLACE resolves the primary-key
conflict by deleting the old row, and that implicit delete fires no DELETE
trigger unless `PRAGMA recursive_triggers` is on. A BEFORE INSERT trigger
now refuses any insert that names the id of an existing row, which is the
only way REPLACE can rewrite one. Plain inserts (id left to the database)
never name an existing id and pass.

Rejected: turning `recursive_triggers` on in every connection. It would
make REPLACE fire `events_no_delete`, but only for connections that set
the pragma; a `sqlite3` shell or script that does not would still rewrite
the log. The trigger lives in the file.

PostgreSQL needs nothing: it has no REPLACE, and `INSERT … ON CONFLICT
(id) DO UPDATE` fires the BEFORE UPDATE trigger of 0003, which refuses it.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 12:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SQLITE_TRIGGER = """
CREATE TRIGGER events_no_replace BEFORE INSERT ON events
WHEN NEW.id IS NOT NULL AND EXISTS (SELECT 1 FROM events WHERE id = NEW.id)
BEGIN SELECT RAISE(ABORT, 'events are append-only: REPLACE of an existing event refused'); END
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute(SQLITE_TRIGGER)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("DROP TRIGGER IF EXISTS events_no_replace")
