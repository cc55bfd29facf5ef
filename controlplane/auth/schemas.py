from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from controlplane.auth.roles import Role
from controlplane.types import Name


class TokenCreate(BaseModel):
    name: Name
    role: Role


class TokenCreated(BaseModel):
    id: int
    name: str
    role: Role
    token: str  # shown once; only its hash is stored


class TokenRead(BaseModel):
    """A token without its secret, which is never stored and never shown again."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    role: Role
    created_at: datetime
    created_by: str
    revoked_at: datetime | None
    revoked_by: str | None
    active: bool


class AuditRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    actor: str
    at: datetime
    action: str
    target: str
    outcome: str
    status_code: int | None


class WhoAmI(BaseModel):
    actor: str
    role: Role
