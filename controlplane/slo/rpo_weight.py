"""RPO_weight: how many weight versions behind the `prod` alias a region serves, from the catalog and live reports.

    history      the versions the model's `prod` alias has named, oldest first (the catalog's alias moves)
    served       per region, the model's versions it serves now: the live endpoints of its fresh gateway
                 reports (not stale, same control-plane epoch) and the instances its fresh agent report
                 saw pass their probe (verdict ok)
    lag          per region, the distinct versions the alias named after the last one the region serves
                 that it does not serve (v1 → v2 → v3 with a region on v1: 2; after a rollback to v2: 1,
                 v3 is counted once, it was named)
    RPO_weight   the largest lag over the regions: the standby's, wherever it is the one behind

No figure without evidence: it is measured only when the alias has a
history, at least two regions report (a single region has no standby), every
declared or reporting region has a fresh report, and each serves a version
the alias has named. Otherwise there is no figure and `why` says what is
missing. Pure, apart from `read_evidence`, which only reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy.orm import Session

from common.clock import Clock
from controlplane.agent_report import service as agent_report_service
from controlplane.gateway_report import service as gateway_report_service
from controlplane.topology import repository as topology_repository
from weight_catalog import repository as catalog_repository

ALIAS = "prod"


@dataclass
class RegionServing:
    region: str
    versions: set[str] = field(default_factory=set)
    sources: list[str] = field(default_factory=list)  # "gateway gw-a", "agent agent-1": fresh reports read


@dataclass(frozen=True)
class RpoWeight:
    value: int | None
    why: str
    per_region: dict[str, int | None]


def lag_versions(history: Sequence[str], served: set[str]) -> int | None:
    """Distinct versions the alias named after the last one `served` holds; None if it holds none of them."""
    for index in range(len(history) - 1, -1, -1):
        if history[index] in served:
            return len(set(history[index + 1:]) - served)
    return None


def measure(history: Sequence[str], regions: dict[str, RegionServing | None]) -> RpoWeight:
    """The figure, or None with the reason; `regions` maps every region to what it serves (None: no fresh report)."""
    if not history:
        return RpoWeight(None, f"the catalog has no {ALIAS} alias history for the model", {})
    silent = sorted(r for r, s in regions.items() if s is None or not s.sources)
    if silent:
        return RpoWeight(None, f"no fresh gateway or agent report from region(s) {silent}", {})
    if len(regions) < 2:
        return RpoWeight(None, f"only region(s) {sorted(regions)} report: there is no standby whose weights "
                               "could lag", {})
    per_region = {r: lag_versions(history, s.versions) for r, s in regions.items() if s is not None}
    lost = sorted(r for r, lag in per_region.items() if lag is None)
    if lost:
        detail = {r: sorted(regions[r].versions) for r in lost}  # type: ignore[union-attr]
        return RpoWeight(None, f"region(s) serve no version the {ALIAS} alias has named: {detail}", per_region)
    worst = max(per_region, key=lambda r: per_region[r])  # type: ignore[arg-type, return-value]
    evidence = "; ".join(f"{r}: {per_region[r]} behind ({', '.join(regions[r].sources)})"  # type: ignore[union-attr]
                         for r in sorted(per_region))
    return RpoWeight(per_region[worst], f"{ALIAS} named {len(history)} version(s) in turn; {evidence}", per_region)


def read_evidence(session: Session, *, model: str, clock: Clock, gateway_stale_after: timedelta,
                  agent_stale_after: timedelta) -> tuple[list[str], dict[str, RegionServing | None]]:
    """(the alias's history of versions, oldest first; region → what its fresh reports say it serves)."""
    moves = list(reversed(catalog_repository.alias_moves(session, model=model, name=ALIAS)))
    labels = catalog_repository.version_labels(session, {m.to_version_id for m in moves}) if moves else {}
    history = [labels.get(m.to_version_id, str(m.to_version_id)) for m in moves]
    versions = {v.version for v in catalog_repository.list_versions(session, model=model)}
    regions: dict[str, RegionServing | None] = {r.name: None for r in topology_repository.list_regions(session)}
    for report in gateway_report_service.list_reports(session, clock=clock, stale_after=gateway_stale_after):
        if report.stale or report.foreign_epoch:
            regions.setdefault(report.region, None)
            continue
        serving = regions.get(report.region) or RegionServing(report.region)
        serving.versions |= {e.version for e in report.live_endpoints if e.version in versions}
        serving.sources.append(f"gateway {report.replica_id}")
        regions[report.region] = serving
    for agent in agent_report_service.list_reports(session, clock=clock, stale_after=agent_stale_after):
        if agent.stale:
            regions.setdefault(agent.region, None)
            continue
        serving = regions.get(agent.region) or RegionServing(agent.region)
        serving.versions |= {i.version for i in agent.instances if i.version in versions and i.verdict == "ok"}
        serving.sources.append(f"agent {agent.agent_id}")
        regions[agent.region] = serving
    return history, regions
