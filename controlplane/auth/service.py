"""Token issue and lookup, and audit writes. Never commits."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.auth.models import ApiToken, AuditRecord
from controlplane.auth.roles import Role
from controlplane.clock import Clock

TOKEN_PREFIX = "llt_"


def hash_token(secret: str) -> str:
    # Tokens carry 256 random bits, so a plain sha256 is enough: there is
    # nothing to brute-force that a slow KDF would protect.
    return hashlib.sha256(secret.encode()).hexdigest()


def create_token(
    session: Session, *, name: str, role: Role, created_by: str, clock: Clock
) -> tuple[ApiToken, str]:
    """Return the stored token and the secret, which is shown once and never stored."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken(
        name=name,
        role=role.value,
        token_sha256=hash_token(secret),
        created_at=clock.now(),
        created_by=created_by,
    )
    session.add(token)
    session.flush()
    return token, secret


def authenticate(session: Session, *, secret: str) -> ApiToken | None:
    token = session.scalar(select(ApiToken).where(ApiToken.token_sha256 == hash_token(secret)))
    if token is None or token.revoked_at is not None:
        return None
    return token


def record_audit(
    session: Session,
    *,
    actor: str,
    action: str,
    target: str,
    outcome: str,
    status_code: int | None,
    clock: Clock,
) -> AuditRecord:
    record = AuditRecord(
        actor=actor[:160],
        at=clock.now(),
        action=action[:160],
        target=target[:1000],
        outcome=outcome,
        status_code=status_code,
    )
    session.add(record)
    session.flush()
    return record


def list_audit(session: Session, *, actor: str | None = None, limit: int = 100) -> Sequence[AuditRecord]:
    query = select(AuditRecord).order_by(AuditRecord.id.desc()).limit(limit)
    if actor is not None:
        query = query.where(AuditRecord.actor == actor)
    return session.scalars(query).all()
