"""Catalog queries. No logic, no commits."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from weight_catalog.models import Alias, AliasMove, KnownIssue, Severity, Shard, WeightVersion


def get_version(session: Session, *, model: str, version: str) -> WeightVersion | None:
    return session.scalar(
        select(WeightVersion)
        .where(WeightVersion.model == model, WeightVersion.version == version)
        .options(selectinload(WeightVersion.shards), selectinload(WeightVersion.issues))
    )


def lock_version(session: Session, version: WeightVersion) -> None:
    """Lock `version`'s row (PostgreSQL) and re-read it into the session.

    An alias guard (open critical issues, the last verify) and the writes it
    guards (opening an issue, recording a verify) then take turns: without it,
    READ COMMITTED let an issue commit between a promote's guard read and its
    commit, unseen (tests/integration/weight_catalog/test_catalog_guard_races.py).
    """
    session.execute(select(WeightVersion).where(WeightVersion.id == version.id).with_for_update()
                    .execution_options(populate_existing=True))


def lock_versions(session: Session, version_ids: set[int]) -> None:
    """Lock the rows of `version_ids` (PostgreSQL) in ascending id order, re-reading them into the session.

    Every writer that locks more than one version row takes them in this one
    order. An alias move touches two (the version it leaves, which its
    history row references, and its target): two moves crossing each other
    (prod v1 → v2 while canary v2 → v1) that each locked only the target
    waited on each other's key-share lock and PostgreSQL aborted one as a
    deadlock (tests/integration/weight_catalog/test_catalog_alias_deadlocks.py).
    One row at a time, so the order is the loop's, not a plan's.
    """
    for version_id in sorted(version_ids):
        session.execute(select(WeightVersion).where(WeightVersion.id == version_id).with_for_update()
                        .execution_options(populate_existing=True))


def list_versions(session: Session, *, model: str | None = None) -> Sequence[WeightVersion]:
    query = select(WeightVersion).order_by(WeightVersion.model, WeightVersion.id)
    if model is not None:
        query = query.where(WeightVersion.model == model)
    return session.scalars(query.options(selectinload(WeightVersion.issues))).all()


def get_alias(session: Session, *, model: str, name: str, for_update: bool = False) -> Alias | None:
    """`for_update`: lock the row (PostgreSQL) and re-read it even if the session holds it already."""
    query = select(Alias).where(Alias.model == model, Alias.name == name)
    if for_update:
        query = query.with_for_update().execution_options(populate_existing=True)
    return session.scalar(query)


def list_aliases(session: Session, *, model: str) -> Sequence[Alias]:
    return session.scalars(select(Alias).where(Alias.model == model).order_by(Alias.name)).all()


def aliases_with_versions(session: Session) -> Sequence[tuple[Alias, WeightVersion]]:
    rows = session.execute(
        select(Alias, WeightVersion)
        .join(WeightVersion, WeightVersion.id == Alias.version_id)
        .order_by(Alias.model, Alias.name)
    ).all()
    return [(alias, version) for alias, version in rows]


def alias_moves(session: Session, *, model: str, name: str) -> Sequence[AliasMove]:
    return session.scalars(
        select(AliasMove).where(AliasMove.model == model, AliasMove.alias == name).order_by(AliasMove.id.desc())
    ).all()


def open_critical_issues(session: Session, *, version_id: int) -> Sequence[KnownIssue]:
    return session.scalars(
        select(KnownIssue).where(
            KnownIssue.version_id == version_id,
            KnownIssue.severity == Severity.CRITICAL.value,
            KnownIssue.resolved_at.is_(None),
        )
    ).all()


def open_issues_by_version(session: Session, version_ids: set[int]) -> dict[int, list[KnownIssue]]:
    """Unresolved issues of the given versions, oldest first."""
    if not version_ids:
        return {}
    issues = session.scalars(
        select(KnownIssue)
        .where(KnownIssue.version_id.in_(version_ids), KnownIssue.resolved_at.is_(None))
        .order_by(KnownIssue.id)
    ).all()
    grouped: dict[int, list[KnownIssue]] = {}
    for issue in issues:
        grouped.setdefault(issue.version_id, []).append(issue)
    return grouped


def get_issue(session: Session, *, issue_id: int) -> KnownIssue | None:
    return session.get(KnownIssue, issue_id)


def version_labels(session: Session, ids: set[int]) -> dict[int, str]:
    if not ids:
        return {}
    rows = session.execute(select(WeightVersion.id, WeightVersion.version).where(WeightVersion.id.in_(ids))).all()
    return {row[0]: row[1] for row in rows}


def shard_digests_by_version(session: Session, version_ids: set[int]) -> dict[int, dict[str, str]]:
    """Recorded sha256 of every file of the given versions: version id → path → digest."""
    if not version_ids:
        return {}
    rows = session.execute(
        select(Shard.version_id, Shard.path, Shard.sha256).where(Shard.version_id.in_(version_ids))
    ).all()
    digests: dict[int, dict[str, str]] = {}
    for version_id, path, sha256 in rows:
        digests.setdefault(version_id, {})[path] = sha256
    return digests
