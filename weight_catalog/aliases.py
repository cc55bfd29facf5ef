"""Aliases (prod, canary, shadow, …): promote and roll back by compare-and-set.

Each move writes an `alias.<action>` event (routing tier l7: gateways apply
it from the snapshot), an alias-history row, and advances the snapshot.
Guards, each overridden only by `force` with a reason: open critical known
issues, a semantic fingerprint that differs from prod's, and a last
verify that failed.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from common.clock import Clock
from contract.routing_tier import RoutingTier
from controlplane.errors import InvalidInput, LifelineError
from controlplane.event import service as event_service
from controlplane.routing_version import service as routing_version
from weight_catalog import repository
from weight_catalog.errors import (
    AliasConflict,
    AliasNotFound,
    CriticalKnownIssue,
    FingerprintMismatch,
    LastVerifyFailed,
    NothingToRollBack,
)
from weight_catalog.models import Alias, AliasAction, AliasMove, WeightVersion
from weight_catalog.service import get_version_or_raise

PROD = "prod"


def list_aliases(session: Session, *, model: str) -> Sequence[Alias]:
    return repository.list_aliases(session, model=model)


def get_alias_or_raise(session: Session, *, model: str, name: str) -> Alias:
    alias = repository.get_alias(session, model=model, name=name)
    if alias is None:
        raise AliasNotFound(f"model {model!r} has no alias {name!r}")
    return alias


def alias_history(session: Session, *, model: str, name: str) -> Sequence[AliasMove]:
    return repository.alias_moves(session, model=model, name=name)


def _lock_move(session: Session, *, current: Alias | None, target: WeightVersion) -> None:
    """Lock the versions a move touches, after its alias row and in id order (`repository.lock_versions`).

    The target's lock makes the guards and the writes they guard take turns:
    an issue opened meanwhile is seen by `_refuse_critical`, or opened after
    this move commits. The lock on the version the alias leaves is the one
    its history row's foreign key would take anyway; taken here, in order,
    it cannot be taken against the order of a move crossing this one.
    Lock order for every alias move: alias row, version rows by id, the
    snapshot counter (`routing_version.bump`, last).
    """
    repository.lock_versions(session, {target.id} | ({current.version_id} if current is not None else set()))


def _refuse_critical(session: Session, target: WeightVersion, *, force: bool) -> None:
    """The caller locked the target (`_lock_move`): an issue opened meanwhile is seen here."""
    issues = repository.open_critical_issues(session, version_id=target.id)
    if issues and not force:
        titles = "; ".join(f"#{i.id} {i.title}" for i in issues)
        raise CriticalKnownIssue(
            f"{target.model} {target.version} has open critical known issues ({titles}); "
            "resolve them or force with a reason"
        )


def _refuse_failed_verify(target: WeightVersion, *, force: bool) -> None:
    if target.last_verify_healthy is False and not force:
        at = target.last_verified_at.isoformat() if target.last_verified_at else "an unknown time"
        raise LastVerifyFailed(
            f"{target.model} {target.version} failed its last verify ({at}, at {target.last_verify_location}); "
            "verify it again or force with a reason"
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
    routing_version.bump(session, clock=clock)
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
    _lock_move(session, current=current, target=target)
    _refuse_critical(session, target, force=force)
    _refuse_failed_verify(target, force=force)
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
    # then; a critical issue found or a verify failed since is still refused.
    _lock_move(session, current=current, target=target)
    _refuse_critical(session, target, force=force)
    _refuse_failed_verify(target, force=force)
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
