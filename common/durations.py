"""`Seconds`: a `timedelta` setting that the environment, YAML and JSON give in seconds.

Environment variables arrive as strings; pydantic reads "1.5" as a duration
only through this validator, the same way YAML's and JSON's numbers are read.
One definition for every process's settings.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from pydantic import BeforeValidator


def _seconds(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


Seconds = Annotated[timedelta, BeforeValidator(_seconds)]
