"""Validated scalar types shared by every domain's request schemas.

Names are slugs (no slashes, no NUL, bounded) so they are safe as path
segments, S3 keys and database values on both SQLite and PostgreSQL.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, StringConstraints

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"

Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN, min_length=1, max_length=128)]


def _printable(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL bytes")
    return value


Text = Annotated[str, StringConstraints(max_length=2000), AfterValidator(_printable)]
Reason = Annotated[
    str, StringConstraints(min_length=1, max_length=2000, strip_whitespace=True), AfterValidator(_printable)
]
# Bounded so an id never overflows a PostgreSQL integer column.
Id = Annotated[int, "id"]
MAX_ID = 2**31 - 1


def first_nul(value: object, path: str = "") -> str | None:
    """The path of the first string (or key) holding a NUL in a JSON-like value, or None.

    PostgreSQL text cannot store NUL, SQLite can: records from other
    processes are checked with this so both databases refuse the same input,
    with a 422 naming the field rather than a storage error.
    """
    if isinstance(value, str):
        return path or "value" if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            found = first_nul(str(key), f"{path}.{key}") or first_nul(item, f"{path}.{key}")
            if found:
                return found.lstrip(".")
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = first_nul(item, f"{path}[{index}]")
            if found:
                return found.lstrip(".")
    return None
