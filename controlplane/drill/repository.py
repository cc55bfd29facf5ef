"""Drill queries. No logic, no commits."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from controlplane.drill.models import DrillDefinition, DrillRun
from controlplane.drill.states import DrillRunState


def latest_version(session: Session, *, name: str) -> int:
    return session.scalar(select(func.max(DrillDefinition.version)).where(DrillDefinition.name == name)) or 0


def get_definition(session: Session, *, name: str, version: int | None = None) -> DrillDefinition | None:
    query = select(DrillDefinition).where(DrillDefinition.name == name)
    if version is None:
        query = query.order_by(DrillDefinition.version.desc()).limit(1)
    else:
        query = query.where(DrillDefinition.version == version)
    return session.scalar(query)


def list_definitions(session: Session, *, latest_only: bool = True) -> Sequence[DrillDefinition]:
    query = select(DrillDefinition).order_by(DrillDefinition.name, DrillDefinition.version)
    if latest_only:
        newest = (select(DrillDefinition.name, func.max(DrillDefinition.version).label("v"))
                  .group_by(DrillDefinition.name).subquery())
        query = query.join(newest, (DrillDefinition.name == newest.c.name) & (DrillDefinition.version == newest.c.v))
    return session.scalars(query).all()


def get_run(session: Session, *, run_id: int, fresh: bool = False) -> DrillRun | None:
    query = select(DrillRun).where(DrillRun.id == run_id)
    if fresh:
        query = query.execution_options(populate_existing=True)
    return session.scalar(query)


def list_runs(session: Session, *, state: str | None = None, model: str | None = None,
              definition_name: str | None = None, limit: int = 100) -> Sequence[DrillRun]:
    query = select(DrillRun).order_by(DrillRun.id.desc())
    if state is not None:
        query = query.where(DrillRun.state == state)
    if model is not None:
        query = query.where(DrillRun.model == model)
    if definition_name is not None:
        query = query.join(DrillDefinition, DrillRun.definition_id == DrillDefinition.id).where(
            DrillDefinition.name == definition_name)
    return session.scalars(query.limit(limit)).all()


def runs_of_name(session: Session, *, name: str) -> Sequence[DrillRun]:
    """Every run of every version of the definition `name`, newest first."""
    return session.scalars(
        select(DrillRun).join(DrillDefinition, DrillRun.definition_id == DrillDefinition.id)
        .where(DrillDefinition.name == name).order_by(DrillRun.id.desc())
    ).all()


def ended_runs_for_model(session: Session, *, models: Sequence[str]) -> Sequence[DrillRun]:
    """Runs of these model names that ended (passed, failed or aborted), newest first."""
    return session.scalars(
        select(DrillRun).where(DrillRun.model.in_(list(models)), DrillRun.ended_at.is_not(None))
        .order_by(DrillRun.ended_at.desc(), DrillRun.id.desc())
    ).all()


def compare_and_set(session: Session, *, run_id: int, expected_state: str, expected_revision: int,
                    **values: Any) -> bool:
    """`UPDATE … WHERE state = :expected AND revision = :rev`, advancing the revision. True if it won."""
    result = session.execute(
        update(DrillRun)
        .where(DrillRun.id == run_id, DrillRun.state == expected_state, DrillRun.revision == expected_revision)
        .values(revision=expected_revision + 1, **values)
        .execution_options(synchronize_session=False)
    )
    return result.rowcount == 1


def first_defined_at(session: Session) -> dict[str, datetime]:
    """name → when its first version was defined: when a passing run first fell due."""
    rows = session.execute(select(DrillDefinition.name, func.min(DrillDefinition.created_at))
                           .group_by(DrillDefinition.name))
    return {name: at for name, at in rows}


def last_passed_at(session: Session) -> dict[str, datetime]:
    """name → when its last passing run ended (any version of the definition)."""
    rows = session.execute(
        select(DrillDefinition.name, func.max(DrillRun.ended_at))
        .join(DrillDefinition, DrillRun.definition_id == DrillDefinition.id)
        .where(DrillRun.state == DrillRunState.PASSED.value, DrillRun.ended_at.is_not(None))
        .group_by(DrillDefinition.name))
    return {name: at for name, at in rows}
