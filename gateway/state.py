"""What the lifespan builds and every route reads: the gateway's typed application state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from contract.lease import LeaseRegistry
from gateway.deps import Deps
from gateway.metrics import GatewayMetrics
from gateway.router import LeaseView
from gateway.routing_table import RoutingTable
from gateway.sessions import SessionKeeper
from gateway.settings import GatewaySettings
from gateway.token_log import TokenLog


@dataclass
class GatewayState:
    settings: GatewaySettings
    table: RoutingTable
    registry: LeaseRegistry
    view: LeaseView
    token_log: TokenLog
    deps: Deps
    metrics: GatewayMetrics
    sessions: SessionKeeper


def get_state(request: Request) -> GatewayState:
    return request.app.state.gateway


State = Annotated[GatewayState, Depends(get_state)]
