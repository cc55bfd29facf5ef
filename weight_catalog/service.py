"""Catalog logic: register, verify, known issues, promote and rollback.

Functions take keyword-only arguments, never commit, and raise typed
errors from `weight_catalog.errors`. Hashing happens before any database
work (`scan_artifact`), so a long hash never holds a transaction open.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from common.clock import Clock
from controlplane.errors import InvalidInput, LifelineError
from controlplane.event import service as event_service
from controlplane.event.models import RoutingTier
from controlplane.snapshot import service as snapshot_service
from weight_catalog import repository
from weight_catalog.errors import (
    AliasConflict,
    AliasNotFound,
    CriticalKnownIssue,
    FingerprintMismatch,
    InvalidArtifact,
    IssueAlreadyResolved,
    IssueNotFound,
    NothingToRollBack,
    VersionExists,
    VersionNotFound,
)
from weight_catalog.fingerprint import fingerprint, fingerprint_parts
from weight_catalog.hashing import DEFAULT_BLOCK_BYTES, Progress, ShardDigest, hash_shards
from weight_catalog.models import Alias, AliasAction, AliasMove, KnownIssue, Severity, Shard, WeightVersion
from weight_catalog.schemas import ShardMismatch, VerifyReport
from weight_catalog.store import ArtifactStore

PROD = "prod"
REQUIRED_FILES = ("config.json", "tokenizer.json")


@dataclass(frozen=True)
class ArtifactScan:
    location: str
    shards: list[ShardDigest]
    total_bytes: int
    fingerprint_parts: dict[str, str]
    fingerprint: str


def scan_artifact(
    store: ArtifactStore,
    *,
    workers: int = 4,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    progress: Progress | None = None,
    files: dict[str, int] | None = None,
) -> ArtifactScan:
    """Hash every file of an artifact and compute its semantic fingerprint."""
    files = files if files is not None else store.list_files()
    missing = [name for name in REQUIRED_FILES if name not in files]
    if missing:
        raise InvalidArtifact(f"{store.location} has no {', '.join(missing)}")
    parts = fingerprint_parts(lambda name: store.read_text(name) if name in files else None)
    shards = hash_shards(store, list(files), workers=workers, block_bytes=block_bytes, progress=progress)
    return ArtifactScan(
        location=store.location,
        shards=shards,
        total_bytes=sum(s.size for s in shards),
        fingerprint_parts=parts,
        fingerprint=fingerprint(parts),
    )


def get_version_or_raise(session: Session, *, model: str, version: str) -> WeightVersion:
    found = repository.get_version(session, model=model, version=version)
    if found is None:
        raise VersionNotFound(f"model {model!r} has no version {version!r}")
    return found


def ensure_version_absent(session: Session, *, model: str, version: str) -> None:
    if repository.get_version(session, model=model, version=version) is not None:
        raise VersionExists(f"model {model!r} already has a version {version!r}")


def list_versions(session: Session, *, model: str | None = None) -> Sequence[WeightVersion]:
    return repository.list_versions(session, model=model)


def create_version(
    session: Session, *, model: str, version: str, scan: ArtifactScan, actor: str, clock: Clock
) -> WeightVersion:
    ensure_version_absent(session, model=model, version=version)
    weight_version = WeightVersion(
        model=model,
        version=version,
        location=scan.location,
        total_bytes=scan.total_bytes,
        fingerprint=scan.fingerprint,
        fingerprint_parts=scan.fingerprint_parts,
        registered_by=actor,
        registered_at=clock.utcnow(),
        shards=[Shard(path=s.path, size=s.size, sha256=s.sha256) for s in scan.shards],
    )
    session.add(weight_version)
    try:
        with session.begin_nested():
            session.flush()
    except IntegrityError as exc:
        raise VersionExists(f"model {model!r} already has a version {version!r}") from exc
    event_service.record(
        session,
        kind="catalog.version.register",
        actor=actor,
        reason="",
        scope=f"model:{model}/version:{version}",
        after={"version": version, "fingerprint": scan.fingerprint, "total_bytes": scan.total_bytes},
        clock=clock,
    )
    return weight_version


def expected_shards(session: Session, *, model: str, version: str) -> list[ShardDigest]:
    """What the catalog recorded for a version, detached from the session."""
    weight_version = get_version_or_raise(session, model=model, version=version)
    return [ShardDigest(path=s.path, size=s.size, sha256=s.sha256) for s in weight_version.shards]


def verify(
    session: Session,
    *,
    model: str,
    version: str,
    store: ArtifactStore,
    workers: int = 4,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    progress: Progress | None = None,
) -> VerifyReport:
    """Re-hash the version at `store`; every mismatched, missing or extra file is reported."""
    expected = expected_shards(session, model=model, version=version)
    return verify_against(
        model=model, version=version, expected=expected, store=store, workers=workers, block_bytes=block_bytes,
        progress=progress,
    )


def verify_against(
    *,
    model: str,
    version: str,
    expected: Sequence[ShardDigest],
    store: ArtifactStore,
    workers: int = 4,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    progress: Progress | None = None,
) -> VerifyReport:
    """Compare `store` with recorded shards; touches no database, so none is held while hashing."""
    by_path = {s.path: s for s in expected}
    present = store.list_files()
    missing = sorted(p for p in by_path if p not in present)
    unexpected = sorted(p for p in present if p not in by_path)
    to_hash = sorted(p for p in by_path if p in present)
    digests = hash_shards(store, to_hash, workers=workers, block_bytes=block_bytes, progress=progress)
    mismatched = [
        ShardMismatch(
            path=d.path,
            expected_sha256=by_path[d.path].sha256,
            actual_sha256=d.sha256,
            expected_size=by_path[d.path].size,
            actual_size=d.size,
        )
        for d in digests
        if d.sha256 != by_path[d.path].sha256 or d.size != by_path[d.path].size
    ]
    return VerifyReport(
        model=model,
        version=version,
        location=store.location,
        healthy=not (mismatched or missing),
        checked=len(digests),
        mismatched=mismatched,
        missing=missing,
        unexpected=unexpected,
    )


# --- known issues -----------------------------------------------------------


def add_issue(
    session: Session,
    *,
    model: str,
    version: str,
    severity: Severity,
    title: str,
    description: str,
    actor: str,
    clock: Clock,
) -> KnownIssue:
    weight_version = get_version_or_raise(session, model=model, version=version)
    issue = KnownIssue(
        version_id=weight_version.id,
        severity=severity.value,
        title=title,
        description=description,
        opened_by=actor,
        opened_at=clock.utcnow(),
    )
    session.add(issue)
    session.flush()
    event_service.record(
        session,
        kind="catalog.issue.add",
        actor=actor,
        reason=title,
        scope=f"model:{model}/version:{version}",
        after={"issue_id": issue.id, "severity": severity.value},
        clock=clock,
    )
    snapshot_service.bump(session, clock=clock)  # the snapshot lists open issues
    return issue


def resolve_issue(session: Session, *, issue_id: int, resolution: str, actor: str, clock: Clock) -> KnownIssue:
    issue = repository.get_issue(session, issue_id=issue_id)
    if issue is None:
        raise IssueNotFound(f"no known issue {issue_id}")
    # Compare-and-set: of any number of concurrent resolves exactly one
    # matches `resolved_at IS NULL`; the rest are refused and write nothing.
    result = session.execute(
        update(KnownIssue)
        .where(KnownIssue.id == issue_id, KnownIssue.resolved_at.is_(None))
        .values(resolved_at=clock.utcnow(), resolved_by=actor, resolution=resolution)
        .execution_options(synchronize_session=False)
    )
    session.refresh(issue)
    if result.rowcount != 1:
        resolved_at = issue.resolved_at.isoformat() if issue.resolved_at else "the same moment"
        raise IssueAlreadyResolved(f"known issue {issue_id} was resolved at {resolved_at}")
    weight_version = issue.weight_version
    event_service.record(
        session,
        kind="catalog.issue.resolve",
        actor=actor,
        reason=resolution,
        scope=f"model:{weight_version.model}/version:{weight_version.version}",
        before={"issue_id": issue.id, "open": True},
        after={"issue_id": issue.id, "open": False},
        clock=clock,
    )
    snapshot_service.bump(session, clock=clock)
    return issue


# --- aliases ----------------------------------------------------------------


def list_aliases(session: Session, *, model: str) -> Sequence[Alias]:
    return repository.list_aliases(session, model=model)


def get_alias_or_raise(session: Session, *, model: str, name: str) -> Alias:
    alias = repository.get_alias(session, model=model, name=name)
    if alias is None:
        raise AliasNotFound(f"model {model!r} has no alias {name!r}")
    return alias


def alias_history(session: Session, *, model: str, name: str) -> Sequence[AliasMove]:
    return repository.alias_moves(session, model=model, name=name)


def _refuse_critical(session: Session, target: WeightVersion, *, force: bool) -> None:
    issues = repository.open_critical_issues(session, version_id=target.id)
    if issues and not force:
        titles = "; ".join(f"#{i.id} {i.title}" for i in issues)
        raise CriticalKnownIssue(
            f"{target.model} {target.version} has open critical known issues ({titles}); "
            "resolve them or force with a reason"
        )


def _refuse_fingerprint(session: Session, target: WeightVersion, *, force: bool) -> None:
    prod = repository.get_alias(session, model=target.model, name=PROD)
    if prod is None or prod.version_id == target.id:
        return
    current = session.get(WeightVersion, prod.version_id)
    if current is None:  # the foreign key makes this unreachable
        raise LifelineError(f"prod alias of {target.model} points at a missing version")
    if current.fingerprint == target.fingerprint or force:
        return
    differing = sorted(
        part
        for part in set(current.fingerprint_parts) | set(target.fingerprint_parts)
        if current.fingerprint_parts.get(part) != target.fingerprint_parts.get(part)
    )
    raise FingerprintMismatch(
        f"{target.model} {target.version} differs from prod ({current.version}) in "
        f"{', '.join(differing)}; a standby must speak the same tokenizer and template — "
        "force with a reason to promote anyway"
    )


def _move(
    session: Session,
    *,
    model: str,
    name: str,
    target: WeightVersion,
    action: AliasAction,
    current: Alias | None,
    expected_revision: int | None,
    forced: bool,
    actor: str,
    reason: str,
    clock: Clock,
) -> AliasMove:
    """Compare-and-set the alias from `current` (as the caller read it) to `target`; write event and history.

    The caller reads `current` before anything it derives `target` from, so
    the revision compared is never newer than what the decision saw.
    """
    started_at = clock.utcnow()
    if expected_revision is not None and (current.revision if current else 0) != expected_revision:
        raise AliasConflict(
            f"alias {name!r} of {model!r} is at revision {current.revision if current else 0}, "
            f"not {expected_revision}"
        )
    if current is not None and current.version_id == target.id:
        raise AliasConflict(f"alias {name!r} of {model!r} already points at {target.version}", type="alias_unchanged")
    before_version: str | None = None
    from_version_id = current.version_id if current is not None else None
    if current is None:
        revision = 1
        try:
            with session.begin_nested():
                session.add(Alias(model=model, name=name, version_id=target.id, revision=1, updated_at=started_at))
                session.flush()
        except IntegrityError as exc:
            raise AliasConflict(f"alias {name!r} of {model!r} was created concurrently; retry") from exc
    else:
        previous = session.get(WeightVersion, current.version_id)
        before_version = previous.version if previous else None
        revision = current.revision + 1
        result = session.execute(
            update(Alias)
            .where(Alias.id == current.id, Alias.revision == current.revision)
            .values(version_id=target.id, revision=revision, updated_at=started_at)
            .execution_options(synchronize_session=False)
        )
        if result.rowcount != 1:
            raise AliasConflict(f"alias {name!r} of {model!r} moved concurrently; retry")
        session.expire(current)
    event = event_service.record(
        session,
        kind=f"alias.{action.value}",
        routing_tier=RoutingTier.L7,  # gateways apply alias moves from the snapshot
        actor=actor,
        reason=reason,
        scope=f"model:{model}/alias:{name}",
        before={"version": before_version, "revision": revision - 1},
        after={"version": target.version, "revision": revision, "forced": forced},
        started_at=started_at,
        clock=clock,
    )
    move = AliasMove(
        model=model,
        alias=name,
        action=action.value,
        from_version_id=from_version_id,
        to_version_id=target.id,
        revision=revision,
        forced=forced,
        actor=actor,
        reason=reason,
        moved_at=started_at,
        event_id=event.id,
    )
    session.add(move)
    session.flush()
    snapshot_service.bump(session, clock=clock)
    return move


def promote(
    session: Session,
    *,
    model: str,
    alias: str,
    version: str,
    actor: str,
    reason: str,
    clock: Clock,
    force: bool = False,
    expected_revision: int | None = None,
) -> AliasMove:
    if force and not reason.strip():
        raise InvalidInput("a forced promote needs a reason", type="force_needs_reason")
    current = repository.get_alias(session, model=model, name=alias, for_update=True)
    target = get_version_or_raise(session, model=model, version=version)
    _refuse_critical(session, target, force=force)
    _refuse_fingerprint(session, target, force=force)
    return _move(
        session,
        model=model,
        name=alias,
        target=target,
        action=AliasAction.PROMOTE,
        current=current,
        expected_revision=expected_revision,
        forced=force,
        actor=actor,
        reason=reason,
        clock=clock,
    )


def rollback_target(session: Session, *, model: str, alias: str) -> WeightVersion:
    """The version the alias held before its latest promote that is not yet rolled back.

    History is a stack: each rollback undoes the most recent live promote,
    so v1 → v2 → v3, rollback, rollback leaves the alias on v1.
    """
    undone = 0
    for move in repository.alias_moves(session, model=model, name=alias):
        if move.action == AliasAction.ROLLBACK:
            undone += 1
            continue
        if undone:
            undone -= 1
            continue
        if move.from_version_id is None:
            break
        target = session.get(WeightVersion, move.from_version_id)
        if target is None:  # the foreign key makes this unreachable
            raise LifelineError(f"alias history of {model} {alias} names a missing version")
        return target
    raise NothingToRollBack(f"alias {alias!r} of {model!r} has no earlier version to return to")


def rollback(
    session: Session,
    *,
    model: str,
    alias: str,
    actor: str,
    reason: str,
    clock: Clock,
    force: bool = False,
    expected_revision: int | None = None,
) -> AliasMove:
    # Read (and on PostgreSQL lock) the alias before its history: a history
    # read before a concurrent rollback committed, paired with an alias read
    # after it, picked a target that was no longer one step back.
    current = repository.get_alias(session, model=model, name=alias, for_update=True)
    if current is None:
        raise AliasNotFound(f"model {model!r} has no alias {alias!r}")
    target = rollback_target(session, model=model, alias=alias)
    # The target held this alias before, so its fingerprint was accepted
    # then; a critical issue found since is still refused.
    _refuse_critical(session, target, force=force)
    return _move(
        session,
        model=model,
        name=alias,
        target=target,
        action=AliasAction.ROLLBACK,
        current=current,
        expected_revision=expected_revision,
        forced=force,
        actor=actor,
        reason=reason,
        clock=clock,
    )
