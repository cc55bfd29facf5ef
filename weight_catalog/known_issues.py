"""Known issues of a version: open one, resolve it once.

Both change what the snapshot shows about a version, so both advance it.
"""

from __future__ import annotations

from sqlalchemy import update
from sqlalchemy.orm import Session

from common.clock import Clock
from controlplane.event import service as event_service
from controlplane.routing_version import service as routing_version
from weight_catalog import repository
from weight_catalog.errors import IssueAlreadyResolved, IssueNotFound
from weight_catalog.models import KnownIssue, Severity
from weight_catalog.service import get_version_or_raise


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
    repository.lock_version(session, weight_version)  # a promote deciding on this version's issues goes first, or sees it
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
    routing_version.bump(session, clock=clock)  # the snapshot lists open issues
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
    routing_version.bump(session, clock=clock)
    return issue
