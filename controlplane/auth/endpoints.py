from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from controlplane.auth import service
from controlplane.auth.dependencies import Admin, Viewer
from controlplane.auth.schemas import AuditRead, TokenCreate, TokenCreated, TokenRead, WhoAmI
from controlplane.db import DbSession
from controlplane.deps import ClockDep, IdPath

router = APIRouter(tags=["auth"])


@router.post("/tokens", status_code=201, response_model=TokenCreated)
def create_token(body: TokenCreate, session: DbSession, principal: Admin, clock: ClockDep) -> TokenCreated:
    token, secret = service.create_token(
        session, name=body.name, role=body.role, created_by=principal.actor, clock=clock
    )
    return TokenCreated(id=token.id, name=token.name, role=body.role, token=secret)


@router.get("/tokens", response_model=list[TokenRead])
def list_tokens(session: DbSession, _: Admin, include_revoked: bool = True) -> list[TokenRead]:
    return [TokenRead.model_validate(t) for t in service.list_tokens(session, include_revoked=include_revoked)]


@router.post("/tokens/{token_id}/revoke", response_model=TokenRead)
def revoke_token(token_id: IdPath, session: DbSession, principal: Admin, clock: ClockDep) -> TokenRead:
    """Revoke a token; it is refused (401) from the next request on. The last active admin token stays."""
    token = service.revoke_token(session, token_id=token_id, actor=principal.actor, clock=clock)
    return TokenRead.model_validate(token)


@router.get("/whoami", response_model=WhoAmI)
def whoami(principal: Viewer) -> WhoAmI:
    return WhoAmI(actor=principal.actor, role=principal.role)


@router.get("/audit", response_model=list[AuditRead])
def list_audit(
    session: DbSession,
    _: Admin,
    actor: Annotated[str | None, Query(max_length=160, pattern=r"^[^\x00]*$")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[AuditRead]:
    return [AuditRead.model_validate(r) for r in service.list_audit(session, actor=actor, limit=limit)]
