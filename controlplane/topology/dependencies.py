"""The lease reader create_app() built, for topology routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from controlplane.topology.lease import LeaseReader


def get_lease_reader(request: Request) -> LeaseReader:
    return request.app.state.lease_reader


LeaseReaderDep = Annotated[LeaseReader, Depends(get_lease_reader)]
