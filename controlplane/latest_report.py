"""Keep the newest report per sender: the upsert gateway and agent reports share. Never commits.

Reports are sent in the background and may arrive out of order after a
retry; an older one is acknowledged and dropped, so what is shown only
moves forward. A sender's first two reports may race to insert: the loser
updates the row the winner stored, under the same rule.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import inspect
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

Row = TypeVar("Row")


def keep_newest(session: Session, row_type: type[Row], key: str, *, fields: dict[str, Any], ordered_by: str,
                received_at: datetime, actor: str) -> Row:
    """Store `fields` as `key`'s row unless the stored one is newer by `fields[ordered_by]`; the row kept."""
    primary_key = inspect(row_type).primary_key[0].name  # type: ignore[union-attr]
    stamp = {"received_at": received_at, "reported_by": actor[:160]}
    row = session.get(row_type, key, with_for_update=True, populate_existing=True)
    if row is None:
        row = row_type(**{primary_key: key}, **stamp, **fields)
        try:
            with session.begin_nested():
                session.add(row)
                session.flush()
            return row
        except IntegrityError:  # the other first report is stored: update it
            row = session.get(row_type, key, with_for_update=True, populate_existing=True)
            if row is None:
                raise
    if fields[ordered_by] < getattr(row, ordered_by):
        return row
    for name, value in {**fields, **stamp}.items():
        setattr(row, name, value)
    session.flush()
    return row
