"""Every date-time column is `UTCDateTime`: the one type that reads back aware UTC on SQLite and PostgreSQL.

A plain `DateTime(timezone=True)` reads back naive on SQLite, and the API
then rendered `2026-01-01T00:00:00` with no offset (the cutover and zonal
shift tables did, until this test). The walk over every GET route
(tests/integration/controlplane/test_controlplane_timestamps_walk.py) finds
the symptom; this finds the cause before any row is written.
"""

from __future__ import annotations

from sqlalchemy import DateTime

from controlplane.db import UTCDateTime
from controlplane.schema import metadata


def test_every_datetime_column_is_utc_datetime() -> None:
    plain = [
        f"{table.name}.{column.name}"
        for table in metadata().sorted_tables
        for column in table.columns
        if isinstance(column.type, DateTime) and not isinstance(column.type, UTCDateTime)
    ]
    datetime_columns = [c for t in metadata().sorted_tables for c in t.columns if isinstance(c.type, UTCDateTime)]
    assert plain == []
    assert len(datetime_columns) > 20  # the registry holds every domain's tables
