"""`Depends(require(Role.OPERATOR))` on every route; sets the audit actor."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from controlplane.auth import service
from controlplane.auth.roles import Role
from controlplane.errors import Forbidden, Unauthenticated

bearer = HTTPBearer(auto_error=False, description="An API token from `lifeline controlplane token create`.")


@dataclass(frozen=True)
class Principal:
    actor: str
    role: Role


def require(required: Role, *also: Role) -> Callable[..., Principal]:
    """A dependency admitting tokens whose role allows `required`, or is one of `also`."""

    def dependency(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> Principal:
        if credentials is None or credentials.scheme.lower() != "bearer":
            raise Unauthenticated("a bearer token is required")
        factory = request.app.state.read_session_factory
        session: Session = factory()
        try:
            token = service.authenticate(session, secret=credentials.credentials)
        finally:
            session.close()
        if token is None:
            raise Unauthenticated("the token is unknown or revoked")
        principal = Principal(actor=f"token:{token.name}#{token.id}", role=Role(token.role))
        request.state.actor = principal.actor
        if not (principal.role.allows(required) or principal.role in also):
            needed = " or ".join([required.value, *(r.value for r in also)])
            raise Forbidden(f"role {principal.role} may not do this; it needs {needed}")
        return principal

    dependency.__name__ = "require_" + "_or_".join([required.value, *(r.value for r in also)])
    return dependency


Viewer = Annotated[Principal, Depends(require(Role.VIEWER))]
Operator = Annotated[Principal, Depends(require(Role.OPERATOR))]
Admin = Annotated[Principal, Depends(require(Role.ADMIN))]
# The snapshot: people who may read, gateways, which route by it, and agents, which reconcile to it.
SnapshotReader = Annotated[Principal, Depends(require(Role.VIEWER, Role.GATEWAY, Role.AGENT))]
# Data-plane reports: gateways only (admins too, to replay a report by hand).
GatewayReporter = Annotated[Principal, Depends(require(Role.GATEWAY, Role.ADMIN))]
# The gateways' reports, read: people, and agents (real traffic on an instance counts as its probe).
GatewayReportReader = Annotated[Principal, Depends(require(Role.VIEWER, Role.AGENT))]
# A regional agent's view of its region: agents only (admins too, by hand).
AgentReporter = Annotated[Principal, Depends(require(Role.AGENT, Role.ADMIN))]
# Automatic data-plane events: gateways and agents, each only under its own actor prefix.
DataPlaneReporter = Annotated[Principal, Depends(require(Role.GATEWAY, Role.AGENT, Role.ADMIN))]
# A zone or region fault for the escalation ladder (POST /api/v1/cutover-escalations): operators, and agents,
# which detect them; of the cutover API an agent may call this and nothing else.
EscalationReporter = Annotated[Principal, Depends(require(Role.OPERATOR, Role.AGENT))]
# Alertmanager's webhook deliveries: its own token only (admins too, to replay a delivery by hand).
AlertSender = Annotated[Principal, Depends(require(Role.ALERTMANAGER, Role.ADMIN))]
