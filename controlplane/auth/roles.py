"""Roles a token carries.

People: viewer < operator < admin, each allowed what the one below is.
Machines: `gateway`, outside that order and allowed nothing else: read the
snapshot, report what it applied (`PUT /api/v1/gateways/{replica}`) and
ship its automatic L7 events (`POST /api/v1/events/dataplane`). A gateway
token that leaks cannot read the catalog, the audit trail or the event log,
and cannot change routing.
"""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"
    GATEWAY = "gateway"

    def allows(self, required: Role) -> bool:
        if Role.GATEWAY in (self, required):
            return self is required
        order = [Role.VIEWER, Role.OPERATOR, Role.ADMIN]
        return order.index(self) >= order.index(required)
