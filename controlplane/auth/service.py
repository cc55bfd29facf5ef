"""Token issue and lookup, and audit writes. Never commits."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from controlplane.auth.errors import LastAdminToken, TokenAlreadyRevoked, TokenNotFound
from controlplane.auth.models import ApiToken, AuditRecord
from controlplane.auth.roles import Role
from common.clock import Clock

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
        created_at=clock.utcnow(),
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


def list_tokens(session: Session, *, include_revoked: bool = True) -> Sequence[ApiToken]:
    query = select(ApiToken).order_by(ApiToken.id)
    if not include_revoked:
        query = query.where(ApiToken.revoked_at.is_(None))
    return session.scalars(query).all()


def revoke_token(session: Session, *, token_id: int, actor: str, clock: Clock) -> ApiToken:
    """Revoke a token; it stops authenticating with the next request.

    Refused for the last active admin token: without one nobody can create
    tokens over the API again (the CLI can still bootstrap one, but only on
    a machine holding the database credentials).
    """
    token = session.get(ApiToken, token_id)
    if token is None:
        raise TokenNotFound(f"no API token {token_id}")
    if token.role == Role.ADMIN.value:
        # PostgreSQL: lock the active admin tokens, so two admins revoking
        # each other's tokens at once are serialised; the second re-reads
        # after the first commits. SQLite ignores FOR UPDATE, but the
        # UPDATE below takes its single write lock before the count, which
        # then sees every committed revocation.
        session.execute(
            select(ApiToken.id)
            .where(ApiToken.role == Role.ADMIN.value, ApiToken.revoked_at.is_(None))
            .with_for_update()
        ).all()
    result = session.execute(
        update(ApiToken)
        .where(ApiToken.id == token_id, ApiToken.revoked_at.is_(None))
        .values(revoked_at=clock.utcnow(), revoked_by=actor[:160])
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:
        session.refresh(token)
        revoked_at = token.revoked_at.isoformat() if token.revoked_at else "the same moment"
        raise TokenAlreadyRevoked(f"API token {token_id} was revoked at {revoked_at}")
    if token.role == Role.ADMIN.value:
        remaining = session.scalar(
            select(func.count()).select_from(ApiToken)
            .where(ApiToken.role == Role.ADMIN.value, ApiToken.revoked_at.is_(None))
        )
        if not remaining:
            # Raising rolls the caller's unit of work back, UPDATE included.
            raise LastAdminToken(
                f"API token {token_id} is the last active admin token; create another admin token first"
            )
    session.refresh(token)
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
        at=clock.utcnow(),
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
