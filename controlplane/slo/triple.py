"""The SLO document's "what is lost, what is kept, how recovery goes" text, generated from evidence.

It used to be three constant sentences, two of them wrong: that in-flight
streams continue elsewhere whatever failed (a region's gateways hold its
streams and the committed-token log they resume from: they end with the
region), and that greedy and seeded continuations are token-identical
whatever the engine (stock vLLM samples seeded requests with a generator
per request, so only greedy is identical there unless Lifeline's logits
processor `lifeline_vllm` is loaded). Now each sentence is built from:

- **the drills' runs** of the model: per fault scope (instance, zone,
  region) the latest ended run says what happened to the streams in flight
  (`migrated_streams`, `requests_lost`, `token_rpo_tokens` of its report)
  and how long it took (`request_rto_s`, `rto_latency_s`, where measured),
  or that the scope was never drilled, in which case the design's
  statement is given and marked unverified;
- **the engine kind and its sampler**, as the newest run that recorded them
  saw (`controlplane/drill/engines.py`): reference engine — greedy and
  seeded identical; vLLM with `lifeline_vllm` — greedy and seeded
  identical; vLLM without it — greedy identical, a seeded stream that
  must move ends `not_resumable` unless its request allows a continuation
  that may differ (`X-Lifeline-Continuation: may-differ`, gateway/serving.py),
  other sampled streams continue and may differ; never recorded — the
  weakest of these, said to be unverified;
- **the replication policies** of the model: the RPO_context each declares
  per session class (`controlplane/replication`), which bounds the session
  context a region loss may cost;
- **the dns tier's record TTLs** (the drivers file's `[dns]`): a region's
  clients reach the standby only once their resolvers' cached answer
  expires, the external record's TTL after the cutover; the region's own
  services follow within the internal record's, and keep resolving for that
  long through a DNS outage.

Pure: the caller reads the runs, the policies and the drivers file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from controlplane.drill.states import DrillRunState, DrillScope
from controlplane.slo.schemas import ContinuationPromise, EngineEvidence, RpoContextPolicy

SCOPES = (DrillScope.INSTANCE, DrillScope.ZONE, DrillScope.REGION)


def latest_by_scope(runs: Sequence[Any]) -> dict[DrillScope, Any]:
    """The newest ended run of each scope (`runs` newest first)."""
    found: dict[DrillScope, Any] = {}
    for run in runs:
        found.setdefault(DrillScope(run.scope), run)
    return found


def _measured(run: Any) -> dict[str, Any]:
    return dict((run.report or {}).get("measured") or {})


def _count(value: Any) -> str:
    return "?" if value is None else f"{float(value):g}"


@dataclass(frozen=True)
class DnsTtls:
    """The dns tier's records: how long resolvers may keep the lost region's answer after a cutover."""

    external_s: int
    internal_s: int | None = None  # None: no internal record managed


def dns_recovery(dns: DnsTtls | None) -> str:
    """How long after the dns cutover clients reach the standby (no "; ": it separates the scopes)."""
    if dns is None:
        return (", though no dns tier is configured here, so how long resolvers keep the lost region's answer is "
                "unknown to this control plane")
    text = (f", which clients reach once their resolvers' cached answer expires, within {dns.external_s} s of the "
            "cutover (the external record's TTL)")
    if dns.internal_s is not None:
        text += (f", and the region's own services, which resolve the internal record, within {dns.internal_s} s "
                 "(its TTL, which also keeps them resolving that long through a DNS outage)")
    return text


def streams_in_flight(scope: DrillScope, run: Any | None, dns: DnsTtls | None = None) -> str:
    """What happened to the streams in flight when `scope` failed: the run's figures, or the design, unverified."""
    if scope == DrillScope.REGION:
        design = ("streams in flight at the region's gateways end with the region (the gateways and the "
                  "committed-token log they would resume from are in it): service recovery only, new requests "
                  "are served by the standby after the dns cutover" + dns_recovery(dns))
    else:
        design = (f"streams in flight on the lost {'instances' if scope == DrillScope.ZONE else 'instance'} "
                  "continue on another from prompt ‖ committed tokens, and the client sees a gap, not a loss")
    if run is None:
        return f"{scope.value}: {design} (never drilled: unverified)"
    report = run.report or {}
    measured = _measured(run)
    figures = (f"{_count(report.get('migrated_streams'))} streams migrated, {_count(measured.get('requests_lost'))} "
               f"requests lost, token RPO {_count(measured.get('token_rpo_tokens'))}")
    # How long: the gap the clients saw and the time until TTFT p99 was back, where the run measured them.
    figures += "".join(f", {label} {float(measured[key]):.3g} s" for key, label in
                       (("request_rto_s", "request RTO"), ("rto_latency_s", "RTO_latency"))
                       if measured.get(key) is not None)
    if run.state != DrillRunState.PASSED:
        return f"{scope.value}: {design} (the last {scope.value} drill, run {run.id}, {run.state}: {figures})"
    lost = measured.get("requests_lost")
    if scope != DrillScope.REGION and lost is not None and float(lost) > 0:
        return f"{scope.value}: run {run.id} lost requests in flight ({figures}): not every stream continued"
    return f"{scope.value}: {design} (run {run.id}: {figures})"


def engine_evidence(runs: Sequence[Any]) -> EngineEvidence:
    """The engines and sampler the newest run that recorded them saw; unverified when none did."""
    for run in runs:
        seen = (run.report or {}).get("engines")
        if seen and seen.get("engines"):
            return EngineEvidence(engines=list(seen["engines"]), sampling=seen.get("sampling"), run_id=run.id)
    return EngineEvidence(engines=[], sampling=None, run_id=None)


# What the gateway does with a client-seeded stream that must move to an engine that cannot redraw it
# (gateway/recovery.py `_allow_inexact`): the client asked for reproducible output.
SEEDED_WITHOUT_SAMPLER = ("ends not_resumable after a move, unless the request sends "
                          "X-Lifeline-Continuation: may-differ: then continues, may differ")


def continuation(engine: EngineEvidence) -> ContinuationPromise:
    """Which decodings continue token-identical after a migration on the same weights, for these engines."""
    if engine.run_id is None:
        return ContinuationPromise(
            greedy="token-identical on the same weights",
            seeded=f"{SEEDED_WITHOUT_SAMPLER} (no drill recorded the engine: token-identical only on the reference "
                   "engine, or on vLLM with Lifeline's logits processor lifeline_vllm loaded; unverified)",
            sampled="continues, may differ", verified=False)
    if engine.sampling == "position_keyed":
        where = ("the reference engine's position-keyed sampler" if engine.engines == ["reference"]
                 else "vLLM with Lifeline's logits processor lifeline_vllm loaded" if engine.engines == ["vllm"]
                 else "every engine samples by position")
        return ContinuationPromise(greedy="token-identical on the same weights",
                                   seeded=f"token-identical on the same weights ({where}; run {engine.run_id})",
                                   sampled="continues, may differ", verified=True)
    why = ("vLLM without Lifeline's logits processor lifeline_vllm: one generator per request"
           if engine.sampling == "engine_default" else "an engine did not say how it samples")
    return ContinuationPromise(greedy="token-identical on the same weights",
                               seeded=f"{SEEDED_WITHOUT_SAMPLER} ({why}; run {engine.run_id})",
                               sampled="continues, may differ", verified=engine.sampling is not None)


def declared_rpo_context(policies: Sequence[Any]) -> list[RpoContextPolicy]:
    """Each replication policy's declared RPO_context, per session class."""
    out = []
    for policy in sorted(policies, key=lambda p: p.session_class):
        if policy.mode == "rebuildable":
            declared = "nothing replicated: the context is prefilled again at the standby (rebuildable)"
        else:
            turns = f" or {policy.rpo_context_turns} turns" if policy.rpo_context_turns is not None else ""
            declared = (f"at most {policy.rpo_context_seconds} s{turns} of context without a checkpoint at the "
                        f"standby ({policy.mode})")
        out.append(RpoContextPolicy(session_class=policy.session_class, mode=policy.mode,
                                    rpo_context_seconds=policy.rpo_context_seconds,
                                    rpo_context_turns=policy.rpo_context_turns, revision=policy.revision,
                                    declared=declared))
    return out


def kv_texts(runs: Sequence[Any], policies: Sequence[RpoContextPolicy], dns: DnsTtls | None = None
             ) -> tuple[str, str, str]:
    """K: (lost, kept, recovery)."""
    by_scope = latest_by_scope(runs)
    classes = "; ".join(f"{p.session_class}: {p.declared}" for p in policies) or (
        "no replication policy: every session's context is prefilled again at the standby")
    lost = ("instance or zone: the KV cache on the lost engines; region: the KV cache and every stream in flight "
            "there, and session context the policies did not replicate")
    kept = (f"committed tokens (the region's token log: the continuation prefills prompt ‖ committed again); "
            f"across regions, replicated session context per class — {classes}")
    recovery = "; ".join(streams_in_flight(scope, by_scope.get(scope), dns) for scope in SCOPES)
    return lost, kept, recovery


def configuration_texts(promise: ContinuationPromise) -> tuple[str, str, str]:
    """C: (lost, kept, recovery)."""
    kept = (f"temperature, top_p, seed, stop travel with every request; greedy: {promise.greedy}; seeded: "
            f"{promise.seeded}; other sampling: {promise.sampled}")
    return ("nothing: sampling parameters travel with every request, not with the instance", kept,
            "none beyond the request's own migration")
