"""Build a model's SLO document from its drill definitions (targets) and drill runs (evidence).

No figure without evidence (issue 14): for each target
the latest ended run of a drill that declares it decides the status:

    never ran                        unverified ("never drilled")
    last run failed or aborted       unverified (the run is named)
    last run older than its cadence  unverified ("stale": instance 7 d, zone 30 d, region 91 d)
    passed, fresh, value ≤ target    measured, with the value and the run id

Where several drills declare one metric the strictest target is the
document's, and a run that measured it against a looser target does not
verify it. Two figures rest on other evidence:

    RPO_weight    measured when the document is built, from the catalog's
                  `prod` history and the regions' fresh gateway and agent
                  reports (`rpo_weight.py`); its evidence is named, not a run
    RPO_context   `rpo_context_tokens`: the context tokens a drill's sessions
                  re-prefilled on their first turn after the fault (the
                  worst session's, from the gateway's `lifeline.session` on
                  each turn; multi-turn session traffic only). Decided like the
                  others from the latest ended run of a drill that declares
                  the target, except that a run whose report carries no
                  measured value (traffic without sessions, a gateway that
                  does not count it) says so: "no drill measured it"

The "lost / kept / recovery" text of K and C is generated too, from the
drill runs (per fault scope), the engines they recorded and the replication
policies' declared RPO_context (`triple.py`).

Never commits.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy.orm import Session

from common.clock import Clock
from controlplane.config import ControlPlaneSettings
from controlplane.drill import repository as drill_repository
from controlplane.drill.models import DrillDefinition, DrillRun
from controlplane.drill.service import DEFAULT_CADENCE
from controlplane.drill.states import DrillRunState, DrillScope
from controlplane.replication import repository as replication_repository
from controlplane.slo import rpo_weight
from controlplane.slo import triple as triple_text
from controlplane.slo.schemas import CatalogView, SloDocument, SloFigure, TripleEntry
from weight_catalog import repository as catalog_repository

# metric → (label, unit)
FIGURES: dict[str, tuple[str, str]] = {
    "rto_latency_s": ("RTO_latency: fault → TTFT back within target", "s"),
    "rto_quality_s": ("RTO_quality: fault → canary passes on every serving instance", "s"),
    "rpo_weight_versions": ("RPO_weight: how far the standby's weights may lag", "versions"),
    "rpo_context_tokens": ("RPO_context: session context lost, recomputed on resume", "tokens"),
    "request_rto_s": ("request RTO: largest gap at the client", "s"),
    "token_rpo_tokens": ("token RPO: tokens lost, duplicated or changed", "tokens"),
}

# dimension → (name, the figures beside it); W's text is the catalog's design, K's and C's come from evidence
# (controlplane/slo/triple.py).
TRIPLE: list[tuple[str, str, list[str]]] = [
    ("W", "weights", ["rto_latency_s", "rto_quality_s", "rpo_weight_versions"]),
    ("K", "KV cache and session state", ["rpo_context_tokens", "request_rto_s", "token_rpo_tokens"]),
    ("C", "generation configuration", []),
]
WEIGHTS_TEXT = (
    "nothing the catalog holds: weights are reloaded from its checksummed artifacts",
    "the version the alias names (sha256 per shard, semantic fingerprint)",
    "a new instance or the warm pool serves the same version, quality back when the canary passes; after a "
    "region loss the standby serves what it staged, at most RPO_weight versions behind prod",
)


def model_names(session: Session, *, model: str) -> tuple[list[str], CatalogView]:
    """The names a drill may use for this model: itself, `model:alias`, and its catalog versions."""
    versions = [v.version for v in catalog_repository.list_versions(session, model=model)]
    labels = {}
    aliases = catalog_repository.list_aliases(session, model=model)
    if aliases:
        labels = catalog_repository.version_labels(session, {a.version_id for a in aliases})
    alias_view = {a.name: labels.get(a.version_id, str(a.version_id)) for a in aliases}
    names = [model, *(f"{model}:{a}" for a in alias_view), *versions]
    return names, CatalogView(versions=versions, aliases=alias_view)


# RPO_context needs a drill whose multi-turn sessions carried context across the fault.
NO_CONTEXT_MEASURED = ("no drill measured it: a drill measures RPO_context only when its traffic sends "
                       "multi-turn sessions (traffic.sessions, session_turns > 1) that carry context across "
                       "the fault, on gateways that say what the engine restored")


def dns_ttls(settings: ControlPlaneSettings) -> triple_text.DnsTtls | None:
    """The TTLs of the records the dns tier moves, from the drivers file: read once, at start-up (the app factory,
    a CLI command), as the drivers themselves are."""
    if settings.cutover_drivers_file is None:
        return None
    from cutover.drivers_file import load

    dns = load(settings.cutover_drivers_file).dns
    if dns is None:
        return None
    return triple_text.DnsTtls(dns.ttl_s, dns.internal_ttl_s if dns.internal_name else None)


def build(session: Session, *, model: str, clock: Clock,
          cadence: dict[DrillScope, timedelta] | None = None,
          gateway_stale_after: timedelta, agent_stale_after: timedelta,
          dns: triple_text.DnsTtls | None) -> SloDocument:
    """`*_stale_after`: the control plane's report staleness settings (a stale report is no evidence); `dns`: the
    dns tier's record TTLs (`dns_ttls`), None where no dns tier is configured.

    Required, not defaulted: a default here would be a second copy of the settings' that drifts.
    """
    names, catalog = model_names(session, model=model)
    definitions = [d for d in drill_repository.list_definitions(session, latest_only=True) if d.model in names]
    runs = drill_repository.ended_runs_for_model(session, models=names)
    figures = {metric: _figure(metric, definitions, runs, clock=clock, cadence=cadence or DEFAULT_CADENCE)
               for metric in FIGURES}
    context = figures["rpo_context_tokens"]
    if context.status == "unverified" and context.measured is None and context.run_id is not None:
        figures["rpo_context_tokens"] = context.model_copy(update={
            "why": f"{context.why}; {NO_CONTEXT_MEASURED}"})
    history, regions = rpo_weight.read_evidence(session, model=model, clock=clock,
                                                gateway_stale_after=gateway_stale_after,
                                                agent_stale_after=agent_stale_after)
    figures["rpo_weight_versions"] = _rpo_weight_figure(definitions, rpo_weight.measure(history, regions),
                                                        clock=clock)
    engine = triple_text.engine_evidence(runs)
    promise = triple_text.continuation(engine)
    policies = triple_text.declared_rpo_context(replication_repository.list_policies(session, model=model))
    texts = {"W": WEIGHTS_TEXT, "K": triple_text.kv_texts(runs, policies, dns),
             "C": triple_text.configuration_texts(promise)}
    triple = [TripleEntry(dimension=dim, name=name, lost=texts[dim][0], kept=texts[dim][1],  # type: ignore[arg-type]
                          recovery=texts[dim][2], figures=[figures[m] for m in metrics])
              for dim, name, metrics in TRIPLE]
    return SloDocument(model=model, generated_at=clock.utcnow(), catalog=catalog, triple=triple, engine=engine,
                       continuation=promise, rpo_context_policies=policies)


def _figure(metric: str, definitions: list[DrillDefinition], runs: list[DrillRun] | object, *, clock: Clock,
            cadence: dict[DrillScope, timedelta]) -> SloFigure:
    label, unit = FIGURES[metric]
    declaring = [d for d in definitions if d.targets.get(metric) is not None]
    base = {"metric": metric, "label": label, "unit": unit, "measured": None, "run_id": None, "drill": None,
            "run_ended_at": None, "status": "unverified"}
    if not declaring:
        return SloFigure(**base, target=None, why="no drill declares a target for it")
    target = min(float(d.targets[metric]) for d in declaring)
    names = {d.name for d in declaring}
    relevant = [r for r in runs if r.definition.name in names]  # type: ignore[attr-defined]
    if not relevant:
        return SloFigure(**base, target=target, why="never drilled")
    last = relevant[0]  # newest first
    base.update(run_id=last.id, drill=f"{last.definition.name} v{last.definition.version}",
                run_ended_at=last.ended_at)
    measured = ((last.report or {}).get("measured") or {}).get(metric)
    base["measured"] = measured
    if last.state != DrillRunState.PASSED:
        return SloFigure(**base, target=target, why=f"the last drill run ({last.id}) {last.state}")
    period = cadence[DrillScope(last.scope)]
    if last.ended_at is None or clock.utcnow() - last.ended_at > period:
        return SloFigure(**base, target=target,
                         why=f"the last drill run ({last.id}) is older than its cadence ({period.days} days)")
    if measured is None:
        return SloFigure(**base, target=target, why=f"the last drill run ({last.id}) did not measure it")
    if float(measured) > target:
        return SloFigure(**base, target=target, why=f"run {last.id} measured {measured:.3f} against a looser target")
    return SloFigure(**{**base, "status": "measured"}, target=target, why=f"measured by drill run {last.id}")


def _rpo_weight_figure(definitions: list[DrillDefinition], lag: rpo_weight.RpoWeight, *, clock: Clock) -> SloFigure:
    """Measured from reports read now; the target is still the strictest a drill of the model declares."""
    label, unit = FIGURES["rpo_weight_versions"]
    declared = [float(d.targets["rpo_weight_versions"]) for d in definitions
                if d.targets.get("rpo_weight_versions") is not None]
    target = min(declared) if declared else None
    base = {"metric": "rpo_weight_versions", "label": label, "unit": unit, "target": target, "run_id": None,
            "drill": None, "run_ended_at": None, "source": "reports",
            "measured": None if lag.value is None else float(lag.value)}
    if lag.value is None:
        return SloFigure(**base, status="unverified", why=lag.why)
    if target is None:
        return SloFigure(**base, status="unverified", why=f"no drill declares a target for it; {lag.why}")
    if lag.value > target:
        return SloFigure(**base, status="unverified",
                         why=f"{lag.value} version(s) behind, over the target of {target:g}; {lag.why}")
    return SloFigure(**base, status="measured", why=f"measured {clock.utcnow().isoformat()}: {lag.why}")
