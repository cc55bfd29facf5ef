"""Request-scoped access to what create_app() built (clock, lease reader, settings)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from common.clock import Clock
from controlplane.config import ControlPlaneSettings
from controlplane.topology.lease import LeaseReader
from controlplane.types import MAX_ID, NAME_PATTERN


def get_clock(request: Request) -> Clock:
    return request.app.state.clock


def get_settings(request: Request) -> ControlPlaneSettings:
    return request.app.state.settings


def get_lease_reader(request: Request) -> LeaseReader:
    return request.app.state.lease_reader


ClockDep = Annotated[Clock, Depends(get_clock)]
SettingsDep = Annotated[ControlPlaneSettings, Depends(get_settings)]
LeaseReaderDep = Annotated[LeaseReader, Depends(get_lease_reader)]

NamePath = Annotated[str, Path(pattern=NAME_PATTERN, min_length=1, max_length=128)]
IdPath = Annotated[int, Path(ge=1, le=MAX_ID)]
