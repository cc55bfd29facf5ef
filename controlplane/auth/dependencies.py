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


def require(required: Role) -> Callable[..., Principal]:
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
        if not principal.role.allows(required):
            raise Forbidden(f"role {principal.role} may not do this; it needs {required}")
        return principal

    dependency.__name__ = f"require_{required.value}"
    return dependency


Viewer = Annotated[Principal, Depends(require(Role.VIEWER))]
Operator = Annotated[Principal, Depends(require(Role.OPERATOR))]
Admin = Annotated[Principal, Depends(require(Role.ADMIN))]
