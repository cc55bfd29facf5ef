"""Request-scoped access to what create_app() built (clock, settings) and shared path types.

A shared piece below every domain, so it names no domain's types; the
topology domain has its own dependency for the lease reader.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from common.clock import Clock
from controlplane.config import ControlPlaneSettings
from controlplane.types import MAX_ID, NAME_PATTERN


def get_clock(request: Request) -> Clock:
    return request.app.state.clock


def get_settings(request: Request) -> ControlPlaneSettings:
    return request.app.state.settings


ClockDep = Annotated[Clock, Depends(get_clock)]
SettingsDep = Annotated[ControlPlaneSettings, Depends(get_settings)]

NamePath = Annotated[str, Path(pattern=NAME_PATTERN, min_length=1, max_length=128)]
IdPath = Annotated[int, Path(ge=1, le=MAX_ID)]
