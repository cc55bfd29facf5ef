"""Catalog routes under /api/v1/catalog. Thin: parse, call the service, shape."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from sqlalchemy.orm import Session

from controlplane.auth.dependencies import Operator, Principal, Viewer, require
from controlplane.auth.roles import Role
from controlplane.db import DbSession
from controlplane.deps import ClockDep, IdPath, NamePath, SettingsDep
from controlplane.types import NAME_PATTERN
from weight_catalog import aliases, canary, known_issues, repository, service, verify
from weight_catalog.models import Alias, AliasMove
from weight_catalog.schemas import (
    AliasMoveRead,
    AliasRead,
    CanaryFailure,
    IssueCreate,
    IssueRead,
    IssueResolve,
    PromoteRequest,
    RegisterVersion,
    RollbackRequest,
    VerifyReport,
    VerifyRequest,
    VersionRead,
    VersionSummary,
)
from weight_catalog.store import check_readable_by_api, open_store

router = APIRouter(prefix="/catalog", tags=["catalog"])

# A version's failed canary (POST …/aliases/{alias}/canary-failures): operators, and the regional agents that run
# the canaries; of the catalog's writes an agent may call this and nothing else.
CanaryFailureReporter = Annotated[Principal, Depends(require(Role.OPERATOR, Role.AGENT))]


def release_connection(session: Session) -> None:
    """End the request's read-only transaction before a long hash.

    Only reads have happened, so rolling back loses nothing; the session
    checks a connection out again for the writes that follow. Without
    this, a hash of many gigabytes kept a pooled connection idle in
    transaction (PostgreSQL) or a read snapshot open (SQLite) throughout.
    """
    session.rollback()


def alias_read(session: Session, alias: Alias) -> AliasRead:
    labels = repository.version_labels(session, {alias.version_id})
    return AliasRead(
        model=alias.model, name=alias.name, version=labels[alias.version_id], revision=alias.revision,
        updated_at=alias.updated_at,
    )


def move_reads(session: Session, moves: list[AliasMove]) -> list[AliasMoveRead]:
    ids = {m.to_version_id for m in moves} | {m.from_version_id for m in moves if m.from_version_id}
    labels = repository.version_labels(session, ids)
    return [
        AliasMoveRead(
            id=m.id, action=m.action, from_version=labels.get(m.from_version_id) if m.from_version_id else None,
            to_version=labels[m.to_version_id], revision=m.revision, forced=m.forced, actor=m.actor,
            reason=m.reason, moved_at=m.moved_at, event_id=m.event_id,
        )
        for m in moves
    ]


@router.get("/versions", response_model=list[VersionSummary])
def list_versions(
    session: DbSession, _: Viewer, model: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=128)] = None
) -> list[VersionSummary]:
    return [VersionSummary.model_validate(v) for v in service.list_versions(session, model=model)]


@router.post("/models/{model}/versions", status_code=201, response_model=VersionRead)
def register_version(
    model: NamePath, body: RegisterVersion, session: DbSession, principal: Operator, clock: ClockDep,
    settings: SettingsDep,
) -> VersionRead:
    """Hash an artifact the control plane can read. Large artifacts: use `lifeline catalog register`."""
    # A plain `def` route: FastAPI runs it in a worker thread, so the hash
    # below never blocks the event loop (a test holds a hash open and
    # requires other requests to be answered meanwhile). Keep it that way,
    # or move the hash to run_in_threadpool if this becomes `async def`.
    service.ensure_version_absent(session, model=model, version=body.version)
    release_connection(session)
    check_readable_by_api(body.location, settings.artifact_roots)
    store = open_store(body.location, s3_endpoint_url=settings.s3_endpoint_url)
    scan = service.scan_artifact(store, workers=settings.hash_workers, block_bytes=settings.hash_block_bytes)
    created = service.create_version(
        session, model=model, version=body.version, scan=scan, actor=principal.actor, clock=clock
    )
    return VersionRead.model_validate(created)


@router.get("/models/{model}/versions/{version}", response_model=VersionRead)
def get_version(model: NamePath, version: NamePath, session: DbSession, _: Viewer) -> VersionRead:
    return VersionRead.model_validate(service.get_version_or_raise(session, model=model, version=version))


@router.post("/models/{model}/versions/{version}/verify", response_model=VerifyReport)
def verify_version(
    model: NamePath, version: NamePath, body: VerifyRequest, session: DbSession, principal: Operator,
    clock: ClockDep, settings: SettingsDep,
) -> VerifyReport:
    """Re-hash the files and recompute the fingerprint; the outcome is recorded on the version.

    A version whose last verify failed is refused by promote and rollback
    (409 `last_verify_failed`) unless forced with a reason.
    """
    found = service.get_version_or_raise(session, model=model, version=version)
    location = body.location or found.location
    expected = service.expected_shards(session, model=model, version=version)
    expected_parts = dict(found.fingerprint_parts)
    release_connection(session)  # worker thread, no connection held: see register_version
    check_readable_by_api(location, settings.artifact_roots)
    store = open_store(location, s3_endpoint_url=settings.s3_endpoint_url)
    report = verify.verify_against(
        model=model, version=version, expected=expected, expected_parts=expected_parts, store=store,
        workers=settings.hash_workers, block_bytes=settings.hash_block_bytes,
    )
    verify.record_verify(session, report=report, actor=principal.actor, clock=clock)
    return report


@router.post("/models/{model}/versions/{version}/issues", status_code=201, response_model=IssueRead)
def add_issue(
    model: NamePath, version: NamePath, body: IssueCreate, session: DbSession, principal: Operator, clock: ClockDep
) -> IssueRead:
    issue = known_issues.add_issue(
        session, model=model, version=version, severity=body.severity, title=body.title,
        description=body.description, actor=principal.actor, clock=clock,
    )
    return IssueRead.model_validate(issue)


@router.post("/issues/{issue_id}/resolve", response_model=IssueRead)
def resolve_issue(
    issue_id: IdPath, body: IssueResolve, session: DbSession, principal: Operator, clock: ClockDep
) -> IssueRead:
    issue = known_issues.resolve_issue(
        session, issue_id=issue_id, resolution=body.resolution, actor=principal.actor, clock=clock
    )
    return IssueRead.model_validate(issue)


@router.get("/models/{model}/aliases", response_model=list[AliasRead])
def list_aliases(model: NamePath, session: DbSession, _: Viewer) -> list[AliasRead]:
    return [alias_read(session, a) for a in aliases.list_aliases(session, model=model)]


@router.get("/models/{model}/aliases/{alias}/history", response_model=list[AliasMoveRead])
def alias_history(model: NamePath, alias: NamePath, session: DbSession, _: Viewer) -> list[AliasMoveRead]:
    aliases.get_alias_or_raise(session, model=model, name=alias)
    return move_reads(session, list(aliases.alias_history(session, model=model, name=alias)))


@router.post("/models/{model}/aliases/{alias}/promote", response_model=AliasRead)
def promote(
    model: NamePath, alias: NamePath, body: PromoteRequest, session: DbSession, principal: Operator, clock: ClockDep
) -> AliasRead:
    aliases.promote(
        session, model=model, alias=alias, version=body.version, actor=principal.actor, reason=body.reason,
        force=body.force, expected_revision=body.expected_revision, clock=clock,
    )
    return alias_read(session, aliases.get_alias_or_raise(session, model=model, name=alias))


@router.post("/models/{model}/aliases/{alias}/rollback", response_model=AliasRead)
def rollback(
    model: NamePath, alias: NamePath, body: RollbackRequest, session: DbSession, principal: Operator, clock: ClockDep
) -> AliasRead:
    aliases.rollback(
        session, model=model, alias=alias, actor=principal.actor, reason=body.reason, force=body.force,
        expected_revision=body.expected_revision, clock=clock,
    )
    return alias_read(session, aliases.get_alias_or_raise(session, model=model, name=alias))


@router.post("/models/{model}/aliases/{alias}/canary-failures", response_model=AliasRead)
def canary_failure(
    model: NamePath, alias: NamePath, body: CanaryFailure, session: DbSession, principal: CanaryFailureReporter,
    clock: ClockDep,
) -> AliasRead:
    """The version `alias` points at failed its canary: the alias is rolled back one step (never `prod`)."""
    canary.rollback_failed_canary(
        session, model=model, alias=alias, version=body.version, expected_revision=body.expected_revision,
        evidence=f"{body.reason} (instances {', '.join(body.instances)}; reported by {principal.actor})",
        actor=principal.actor, clock=clock,
    )
    return alias_read(session, aliases.get_alias_or_raise(session, model=model, name=alias))
