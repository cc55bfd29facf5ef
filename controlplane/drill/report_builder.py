"""A drill run's report: what the run measured against its targets, built once the traffic has ended.

Moved out of controlplane/drill/runner.py unchanged; the runner owns one
`DrillReportBuilder` and calls `build` after the fault is rolled back. Building
sends the RTO_quality canary (the greedy request, straight to each instance,
until every one answers as the undisturbed run did) and reads back the event
log written since the drill began. The renderings of the report (Markdown,
JSON, the timeline plot) are controlplane/drill/report.py.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import httpx

from common.clock import Clock
from common import oneshot_http
from controlplane.drill import faults, measure
from controlplane.drill.measure import RequestTrace
from controlplane.drill.schemas import Targets, Traffic

if TYPE_CHECKING:
    from controlplane.drill.runner import EventReader, Fleet


class DrillReportBuilder:
    def __init__(self, *, fleet: Fleet, clock: Clock, events: EventReader | None, sleep: Callable[[float], None],
                 canary_timeout: float, report_dir: Any) -> None:
        self.fleet = fleet
        self.clock = clock
        self.events = events
        self.sleep = sleep
        self.canary_timeout = canary_timeout
        self.report_dir = report_dir

    def canary(self, model_name: str, traffic: Traffic, expected: list[int]) -> float | None:
        """Until every serving instance answers the greedy request as the undisturbed run did; when (clock.now)."""
        deadline = self.clock.now() + self.canary_timeout
        body = {"model": model_name, "prompt": traffic.prompt, "max_tokens": traffic.max_tokens,
                "temperature": 0.0, "ignore_eos": True, "return_token_ids": True}
        while self.clock.now() < deadline:
            passed = True
            for instance in self.fleet.instance_ids():
                try:
                    response = oneshot_http.post(self.fleet.engine_url(instance) + "/v1/completions",
                                                 json={**body, "model": self.fleet.served_model(instance)}, timeout=30.0)
                    ok = response.status_code == 200 and response.json()["choices"][0]["token_ids"] == expected
                except (httpx.HTTPError, KeyError, ValueError):
                    ok = False
                passed = passed and ok
            if passed:
                return self.clock.now()
            self.sleep(0.2)
        return None

    def build(self, meta: dict[str, Any], plan: faults.FaultPlan, traces: list[RequestTrace],
              expected: dict[str, list[int]], fault_at: float, fault_wall: float, cleared_at: float,
              first_event: int, targets: Targets, baseline_ttft: list[float], tripped: str | None, model_name: str,
              traffic: Traffic, recomputed: float | None = None,
              expected_turns: dict[str, list[list[int]]] | None = None,
              injection_s: float = 0.0) -> dict[str, Any]:
        def expected_of(trace: RequestTrace) -> list[int]:
            return expected_turns[trace.sampling][trace.turn] if expected_turns else expected[trace.sampling]

        comparisons = [measure.compare_tokens(expected_of(t), t.token_ids, t.seqs) for t in traces if not t.error]
        # Only from session turns that carried context across the fault, as the gateway reported them.
        context = measure.rpo_context(traces, fault_at)
        refused = [t for t in traces if t.error and plan.documented_refusal(t)]
        lost = [t for t in traces if t.error and not plan.documented_refusal(t)]
        quality_at = None if tripped else self.canary(model_name, traffic, expected["greedy"])
        events = self.events.events_after(first_event) if self.events is not None else []
        routing_events = [e for e in events if e.get("routing_tier")]
        event_offsets = []
        for event in routing_events:
            offset = datetime.fromisoformat(event["started_at"]).timestamp() - fault_wall
            event_offsets.append((round(offset, 4), f"{event['routing_tier']} {event['kind']}"))
        detection = (measure.detection([offset for offset, _ in event_offsets], injection_s=injection_s)
                     if plan.expects_tier else None)
        if detection is None and plan.expects_tier:  # no event log: the first migrated token at the client
            moved = [tt for t in traces for tt, ep in zip(t.token_times, _epoch_per_token(t), strict=False) if ep > 0]
            detection = (min(moved) - fault_at) if moved else None
        ttft_target = (targets.ttft_target_ms / 1000.0 if targets.ttft_target_ms
                       else 3 * max(baseline_ttft, default=1.0))
        traffic_end = max([fault_at, *(t.ended_at for t in traces if t.ended_at is not None)])
        measured: dict[str, float | None] = {
            "detection_s": detection,
            "request_rto_s": measure.request_rto(traces, fault_at),
            "rto_latency_s": measure.rto_latency(
                traces, fault_at=fault_at, end_at=traffic_end, ttft_target=ttft_target,
                window_s=targets.ttft_window_s, min_samples=targets.ttft_window_min_samples),
            "rto_quality_s": (quality_at - fault_at) if quality_at is not None else None,
            # A from-scratch retry delivers again what the abandoned attempt had delivered: duplicates.
            "token_rpo_tokens": float(sum(c.rpo_tokens for c in comparisons) + sum(t.discarded_tokens
                                                                                   for t in traces)),
            "requests_lost": float(len(lost)),
            # Answers whose tokens differ from the undisturbed run (a bad version served before its canary).
            "wrong_answers": float(sum(1 for c in comparisons if c.changed)),
            "recomputed_decode_tokens": recomputed,
            # The worst session's re-prefilled context after the fault (None: no session carried any: unverified).
            "rpo_context_tokens": context.tokens,
            **plan.measurements(fault_at, cleared_at),
        }
        target_values = {"request_rto_s": targets.request_rto_s, "rto_latency_s": targets.rto_latency_s,
                         "rto_quality_s": targets.rto_quality_s,
                         "rpo_context_tokens": None if targets.rpo_context_tokens is None
                         else float(targets.rpo_context_tokens),
                         "token_rpo_tokens": None if targets.token_rpo_tokens is None else float(targets.token_rpo_tokens),
                         "requests_lost": 0.0, **plan.targets()}
        verdicts = measure.verdicts(measured, target_values)
        follow_ups = [f"{v.metric}: measured {_fmt(v.measured)} vs target {_fmt(v.target)}"
                      for v in verdicts if v.met is False]
        # the tiers that acted on this fault; earlier events stay in the report's timeline (event_offsets)
        tiers = [e["routing_tier"] for e, (offset, _) in zip(routing_events, event_offsets, strict=True)
                 if measure.since_fault(offset, injection_s=injection_s)]
        if self.events is not None and plan.expects_tier and meta["expected_tier"] not in tiers:
            follow_ups.append(f"expected the {meta['expected_tier']} tier to act; events showed {tiers or 'none'}")
        follow_ups += plan.checks()
        if tripped:
            follow_ups.insert(0, f"aborted by stop condition: {tripped}; fault rolled back")
        report = {
            **meta,
            "fault_target": plan.target,
            "faulted_instances": list(plan.instances),
            "fault_cleared_at_s": round(cleared_at - fault_at, 4),
            "requests_during_fault": sum(1 for t in traces if t.started_at < cleared_at
                                         and (t.ended_at is None or t.ended_at > fault_at)),
            "refused_as_documented": len(refused),
            "fault_details": plan.details(),
            "passed": not follow_ups and not tripped,
            "aborted": tripped,
            "fault_at_s": 0.0,
            # How long the fault's own action took (kills, an admin call); the fault is stamped when it returned.
            "fault_injection_s": round(injection_s, 4),
            "measured": measured,
            "targets": target_values,
            "verdicts": [v.__dict__ for v in verdicts],
            "follow_ups": follow_ups,
            "requests": len(traces),
            "migrated_streams": measure.migrated(traces),
            "retried_requests": sum(1 for t in traces if t.attempts > 1),
            "tokens_redelivered_by_retry": sum(t.discarded_tokens for t in traces),
            "ttft_p99_s": measure.ttft_p99(traces),
            "rto_latency_window": {"target_s": ttft_target, "window_s": targets.ttft_window_s,
                                   "min_samples": targets.ttft_window_min_samples,
                                   "samples": len(measure.ttft_samples(traces, ttft_target))},
            "sessions": traffic.sessions,
            "session_turns": traffic.session_turns if traffic.sessions else 0,
            "rpo_context_by_class": context.by_class,
            "rpo_context_sessions": [r.__dict__ for r in context.sessions],
            "error_rate": measure.error_rate(traces),
            "events": [{k: e.get(k) for k in ("id", "kind", "routing_tier", "actor", "reason", "scope",
                                                "started_at", "outcome")} for e in events],
            "routing_tiers_in_order": tiers,
            "event_offsets": event_offsets,
            # The timeline, relative to the fault (seconds): one row per request for the plot.
            "timeline": [{"index": t.index, "sampling": t.sampling, "start": t.started_at - fault_at,
                          "end": (t.ended_at - fault_at) if t.ended_at is not None else None,
                          "tokens": [round(x - fault_at, 4) for x in t.token_times],
                          "epochs": _epoch_per_token(t), "error": t.error, "attempts": t.attempts,
                          "gateways": list(dict.fromkeys(t.gateways)),
                          **({"session_id": t.session_id, "turn": t.turn, "session": t.session}
                             if t.session_id else {})} for t in traces],
        }
        if self.report_dir is not None:
            from controlplane.drill.report import export_report

            report["files"] = [str(p) for p in export_report(report, self.report_dir)]
        return report


def _epoch_per_token(trace: RequestTrace) -> list[int]:
    """One epoch per token that reached the client (every attempt's): recorded per chunk carrying tokens, and
    chunks carry one token each on the gateway; padded with the last one where a chunk said none."""
    n = len(trace.token_times)
    if len(trace.epochs) >= n:
        return trace.epochs[:n]
    return trace.epochs + [trace.epochs[-1] if trace.epochs else 0] * (n - len(trace.epochs))


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"

