"""Mesh route queries. No logic, no commits."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.mesh_route.models import ANY, MeshRouteRecord

_ORDER = (MeshRouteRecord.model, MeshRouteRecord.region, MeshRouteRecord.cohort)


def find_route(session: Session, *, model: str, region: str | None, cohort: str | None) -> MeshRouteRecord | None:
    """The route of `model` for `region` and `cohort`; None (or `*`) for either: every region, the default route."""
    return session.scalar(select(MeshRouteRecord).where(
        MeshRouteRecord.model == model, MeshRouteRecord.region == (region or ANY),
        MeshRouteRecord.cohort == (cohort or ANY)))


def list_routes(session: Session) -> Sequence[MeshRouteRecord]:
    return session.scalars(select(MeshRouteRecord).order_by(*_ORDER)).all()


def routes_for_region(session: Session, *, region: str) -> Sequence[MeshRouteRecord]:
    """The routes that apply in `region`: its own and the every-region ones."""
    return session.scalars(select(MeshRouteRecord).where(MeshRouteRecord.region.in_([region, ANY]))
                           .order_by(*_ORDER)).all()
