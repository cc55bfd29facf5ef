"""Roles a token carries.

People: viewer < operator < admin, each allowed what the one below is.
Machines: `gateway`, outside that order and allowed nothing else: read the
snapshot, report what it applied (`PUT /api/v1/gateways/{replica}`) and
ship its automatic L7 events (`POST /api/v1/events/dataplane`). A gateway
token that leaks cannot read the catalog, the audit trail or the event log,
and cannot change routing.
`agent` (a regional agent), likewise outside it: read the snapshot and the
gateways' reports (real traffic counts as a probe), report its view of the
region (`PUT /api/v1/agents/{region}`), ship its `agent:` events, and
report a zone or region fault it detected (`POST /api/v1/cutover-escalations`
— the one cutover route it may call: the ladder decides what to cut over,
and an agent cannot plan, execute, roll back or read cutovers).
`alertmanager`, likewise: deliver alerts to `POST /api/v1/alerts/alertmanager`
and nothing else; what an alert may do is the alert routes file's, not the
token's (controlplane/alerts/routes.py).
"""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"
    GATEWAY = "gateway"
    AGENT = "agent"
    ALERTMANAGER = "alertmanager"

    def allows(self, required: Role) -> bool:
        if self in MACHINES or required in MACHINES:
            return self is required
        order = [Role.VIEWER, Role.OPERATOR, Role.ADMIN]
        return order.index(self) >= order.index(required)


MACHINES = frozenset({Role.GATEWAY, Role.AGENT, Role.ALERTMANAGER})
