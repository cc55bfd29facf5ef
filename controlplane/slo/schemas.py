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


class EngineEvidence(BaseModel):
    """The engines the newest drill run that recorded them saw (controlplane/drill/engines.py); none: unknown."""

    engines: list[str]  # "reference", "vllm"
    sampling: str | None  # the weakest seen: "position_keyed" | "engine_default"; None: unknown
    run_id: int | None


class ContinuationPromise(BaseModel):
    """What a continuation after a migration on the same weights is, per decoding, for those engines."""

    greedy: str
    seeded: str
    sampled: str
    verified: bool  # False: no drill recorded the engines, or one did not say how it samples


class RpoContextPolicy(BaseModel):
    """The RPO_context a replication policy declares for one session class of the model."""

    session_class: str
    mode: str
    rpo_context_seconds: int
    rpo_context_turns: int | None
    revision: int
    declared: str


class CatalogView(BaseModel):
    versions: list[str]
    aliases: dict[str, str]  # alias → version


class SloDocument(BaseModel):
    model: str
    generated_at: datetime
    catalog: CatalogView
    triple: list[TripleEntry]
    engine: EngineEvidence
    continuation: ContinuationPromise
    rpo_context_policies: list[RpoContextPolicy]
    note: str = ("Generated from the drill runs, the engines they recorded and the replication policies in the "
                 "control plane; never edited by hand. A target without a passed drill run within its cadence is "
                 "unverified, never met.")
