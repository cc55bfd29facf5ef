"""Cutover queries. No logic, no commits."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, selectinload

from contract.routing_tier import RoutingTier
from controlplane.mesh_route.models import MeshRouteRecord
from cutover.drivers.step import MeshRouteTarget
from cutover.models import Cutover, CutoverGate, CutoverStep, ZonalShift
from cutover.states import ACTIVE_STATES, CutoverState


def get_cutover(session: Session, *, cutover_id: int, fresh: bool = False, lock: bool = False) -> Cutover | None:
    """`fresh`: re-read the row even if the session holds it (after a compare-and-set).

    `lock`: `SELECT … FOR UPDATE` (fresh too), so admin calls on one cutover — an abort, a rollback, the
    runner's completion — take turns until the transaction ends. PostgreSQL only; SQLite's write
    transactions already queue on its one write lock (`BEGIN IMMEDIATE`, controlplane.db).
    """
    query = select(Cutover).where(Cutover.id == cutover_id).options(selectinload(Cutover.steps))
    if lock:
        query = query.with_for_update(of=Cutover)
    if fresh or lock:
        query = query.execution_options(populate_existing=True)
    return session.scalar(query)


def list_cutovers(
    session: Session, *, state: str | None = None, scope_prefix: str | None = None, limit: int = 100
) -> Sequence[Cutover]:
    query = select(Cutover).options(selectinload(Cutover.steps)).order_by(Cutover.id.desc())
    if state is not None:
        query = query.where(Cutover.state == state)
    if scope_prefix is not None:
        escaped = scope_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        query = query.where(Cutover.scope.like(escaped + "%", escape="\\"))
    return session.scalars(query.limit(limit)).all()


def active_for_scope(session: Session, *, scope: str) -> Cutover | None:
    return session.scalar(
        select(Cutover).where(Cutover.scope == scope, Cutover.state.in_([s.value for s in ACTIVE_STATES]))
    )


def last_ended_for_scope(session: Session, *, scope: str, exclude_id: int | None = None) -> Cutover | None:
    query = select(Cutover).where(Cutover.scope == scope, Cutover.ended_at.is_not(None))
    if exclude_id is not None:
        query = query.where(Cutover.id != exclude_id)
    return session.scalar(query.order_by(Cutover.ended_at.desc()).limit(1))


def holding_out(session: Session, *, exclude_id: int | None = None) -> Sequence[Cutover]:
    """Cutovers that hold their scope out of routing: `out`, in effect, not rolled back, not superseded.

    An `out` cutover is superseded by a later `in` cutover of the same scope
    that is in effect (the scope was put back without rolling the first back).
    """
    in_effect = [s.value for s in (CutoverState.EXECUTING, CutoverState.VERIFYING, CutoverState.COMPLETED)]
    query = select(Cutover).where(Cutover.state.in_(in_effect))
    if exclude_id is not None:
        query = query.where(Cutover.id != exclude_id)
    latest: dict[str, Cutover] = {}
    for cutover in session.scalars(query.order_by(Cutover.id)):
        latest[cutover.scope] = cutover
    return [c for c in latest.values() if c.target_state == "out"]


def compare_and_set(
    session: Session, *, cutover_id: int, expected_state: str, expected_revision: int, **values: Any
) -> bool:
    """`UPDATE … WHERE state = :expected AND revision = :rev`, advancing the revision. True if it won."""
    result = session.execute(
        update(Cutover)
        .where(Cutover.id == cutover_id, Cutover.state == expected_state, Cutover.revision == expected_revision)
        .values(revision=expected_revision + 1, **values)
        .execution_options(synchronize_session=False)
    )
    return result.rowcount == 1


def update_step(session: Session, *, step_id: int, **values: Any) -> None:
    session.execute(
        update(CutoverStep).where(CutoverStep.id == step_id).values(**values)
        .execution_options(synchronize_session=False)
    )


def get_gate(session: Session) -> CutoverGate | None:
    return session.get(CutoverGate, 1, populate_existing=True)


def get_zonal_shift(session: Session, *, shift_id: int) -> ZonalShift | None:
    return session.get(ZonalShift, shift_id, populate_existing=True)


def active_zonal_shift(session: Session, *, region: str, zone: str) -> ZonalShift | None:
    return session.scalar(
        select(ZonalShift).where(ZonalShift.region == region, ZonalShift.zone == zone, ZonalShift.ended_at.is_(None))
    )


def list_zonal_shifts(session: Session, *, active_only: bool, limit: int = 100) -> Sequence[ZonalShift]:
    query = select(ZonalShift).order_by(ZonalShift.id.desc())
    if active_only:
        query = query.where(ZonalShift.ended_at.is_(None))
    return session.scalars(query.limit(limit)).all()


def due_zonal_shifts(session: Session, *, now: datetime) -> Sequence[ZonalShift]:
    return session.scalars(
        select(ZonalShift).where(ZonalShift.ended_at.is_(None), ZonalShift.expires_at <= now).order_by(ZonalShift.id)
    ).all()


def mesh_route_holders(session: Session, route: MeshRouteRecord) -> list[int]:
    """Cutovers with a mesh step on this route that are running, completed or failed: their rollback restores it.

    What `controlplane.mesh_route.service.delete_route` refuses to delete under (`RouteHolders`).
    """
    held = [s.value for s in ACTIVE_STATES | {CutoverState.COMPLETED, CutoverState.FAILED}]
    steps = session.scalars(select(CutoverStep).join(Cutover, Cutover.id == CutoverStep.cutover_id).where(
        CutoverStep.tier == RoutingTier.MESH.value, Cutover.state.in_(held))).all()
    targets = [(step.cutover_id, step.expected_before.target) for step in steps]
    return sorted({cutover_id for cutover_id, target in targets if isinstance(target, MeshRouteTarget)
                   and (target.model, target.route_region, target.cohort) == (route.model, route.region, route.cohort)})


def counts_by_tier_and_state(session: Session) -> dict[tuple[str, str], int]:
    """(tier, state) → how many cutovers: what the control plane's /metrics exports (cutover/exposition.py)."""
    rows = session.execute(select(Cutover.tier, Cutover.state, func.count()).group_by(Cutover.tier, Cutover.state))
    return {(tier, state): n for tier, state, n in rows}


def unclaimed_in_flight(session: Session, *, now: datetime) -> dict[str, int]:
    """tier → cutovers mid-way (executing, verifying, rolling back) whose runner's claim has lapsed: none drives them."""
    query = (select(Cutover.tier, func.count())
             .where(Cutover.state.in_([s.value for s in ACTIVE_STATES]),
                    (Cutover.claimed_until.is_(None)) | (Cutover.claimed_until < now))
             .group_by(Cutover.tier))
    return {tier: n for tier, n in session.execute(query)}
