"""Replication queries. No logic, no commits."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import case, delete, func, select, update
from sqlalchemy.orm import Session

from controlplane.replication.models import ReplicationDeadLetter, ReplicationPolicy, ReplicationStatus


def get_policy(session: Session, *, model: str, session_class: str) -> ReplicationPolicy | None:
    return session.scalar(select(ReplicationPolicy).where(ReplicationPolicy.model == model,
                                                          ReplicationPolicy.session_class == session_class))


def get_policy_by_id(session: Session, *, policy_id: int) -> ReplicationPolicy | None:
    return session.get(ReplicationPolicy, policy_id)


def list_policies(session: Session, *, model: str | None = None) -> Sequence[ReplicationPolicy]:
    query = select(ReplicationPolicy).order_by(ReplicationPolicy.model, ReplicationPolicy.session_class)
    if model is not None:
        query = query.where(ReplicationPolicy.model == model)
    return session.scalars(query).all()


def compare_and_set_policy(session: Session, *, policy_id: int, expected_revision: int, **values: Any) -> bool:
    """`UPDATE … WHERE revision = :rev`, advancing the revision. True if it won."""
    result = session.execute(
        update(ReplicationPolicy)
        .where(ReplicationPolicy.id == policy_id, ReplicationPolicy.revision == expected_revision)
        .values(revision=expected_revision + 1, **values)
        .execution_options(synchronize_session=False)
    )
    return result.rowcount == 1


def get_status(session: Session, *, policy_id: int) -> ReplicationStatus | None:
    return session.get(ReplicationStatus, policy_id)


def update_status(session: Session, *, policy_id: int, **values: Any) -> None:
    session.execute(update(ReplicationStatus).where(ReplicationStatus.policy_id == policy_id).values(**values)
                    .execution_options(synchronize_session=False))


def count_replicated(session: Session, *, policy_id: int, blocks: int, **values: Any) -> None:
    """One verified copy: increments in SQL, so concurrent workers never lose a count."""
    status = ReplicationStatus
    session.execute(
        update(status).where(status.policy_id == policy_id)
        .values(replicated_total=status.replicated_total + 1, blocks_copied_total=status.blocks_copied_total + blocks,
                pending=case((status.pending > 0, status.pending - 1), else_=0), **values)
        .execution_options(synchronize_session=False))


def count_settled(session: Session, *, policy_id: int) -> None:
    """A dead letter, or a copy that found its checkpoint already there: one checkpoint fewer pending."""
    status = ReplicationStatus
    session.execute(update(status).where(status.policy_id == policy_id)
                    .values(pending=case((status.pending > 0, status.pending - 1), else_=0))
                    .execution_options(synchronize_session=False))


def count_deleted(session: Session, *, policy_id: int, deleted: int) -> None:
    status = ReplicationStatus
    session.execute(update(status).where(status.policy_id == policy_id)
                    .values(deleted_total=status.deleted_total + deleted).execution_options(synchronize_session=False))


def dead_letters(session: Session, *, policy_id: int,
                 states: Collection[str] | None = None) -> Sequence[ReplicationDeadLetter]:
    query = select(ReplicationDeadLetter).where(ReplicationDeadLetter.policy_id == policy_id)
    if states is not None:
        query = query.where(ReplicationDeadLetter.state.in_(sorted(states)))
    return session.scalars(query.order_by(ReplicationDeadLetter.id)).all()


def dead_letter_counts(session: Session) -> dict[tuple[int, str], int]:
    """(policy id, state) → dead letters: one grouped query, for the metrics page."""
    letter = ReplicationDeadLetter
    rows = session.execute(select(letter.policy_id, letter.state, func.count()).group_by(letter.policy_id,
                                                                                        letter.state))
    return {(policy_id, state): count for policy_id, state, count in rows}


def compare_and_set_dead_letter(session: Session, *, letter_id: int, expected_state: str, **values: Any) -> bool:
    """`UPDATE … WHERE state = :expected`. True if it won."""
    letter = ReplicationDeadLetter
    result = session.execute(update(letter).where(letter.id == letter_id, letter.state == expected_state)
                             .values(**values).execution_options(synchronize_session=False))
    return result.rowcount == 1


def delete_dead_letter(session: Session, *, policy_id: int, key: str, expected_state: str) -> bool:
    letter = ReplicationDeadLetter
    result = session.execute(delete(letter).where(letter.policy_id == policy_id, letter.checkpoint_key == key,
                                                  letter.state == expected_state)
                             .execution_options(synchronize_session=False))
    return result.rowcount == 1


def get_dead_letter(session: Session, *, policy_id: int, key: str) -> ReplicationDeadLetter | None:
    return session.scalar(select(ReplicationDeadLetter).where(ReplicationDeadLetter.policy_id == policy_id,
                                                              ReplicationDeadLetter.checkpoint_key == key))
