"""The SLO document's shape: the W/K/C triple, each target beside its latest measured value and run."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel


class SloFigure(BaseModel):
    """One target. `status` is `measured` only with a fresh, passed drill run that measured it within target."""

    metric: str
    label: str
    unit: str
    target: float | None
    measured: float | None
    status: Literal["measured", "unverified"]
    why: str  # what the status rests on: the run, or why there is no evidence
    run_id: int | None
    drill: str | None
    run_ended_at: datetime | None
    # drill_run: the run named above measured it; reports: read from the catalog and live reports when generated
    source: Literal["drill_run", "reports"] = "drill_run"


class TripleEntry(BaseModel):
    dimension: Literal["W", "K", "C"]
    name: str
    lost: str
    kept: str
    recovery: str
    figures: list[SloFigure]


class CatalogView(BaseModel):
    versions: list[str]
    aliases: dict[str, str]  # alias → version


class SloDocument(BaseModel):
    model: str
    generated_at: datetime
    catalog: CatalogView
    triple: list[TripleEntry]
    note: str = ("Generated from the drill runs in the control plane; never edited by hand. A target without a "
                 "passed drill run within its cadence is unverified, never met.")
