"""Prometheus metrics of the cutover workflow (the process's default registry, served at the control plane's /metrics).

    lifeline_cutover_escalation_decisions_total{action,fault_scope,tier}   every decision of the ladder
    lifeline_cutover_abort_requests_total{outcome}                          requested | repeated | rolled_back_now
                                                                            | already_rolling_back
    lifeline_cutover_gate_changes_total{to}                                 stopped | released
"""

from __future__ import annotations

from prometheus_client import Counter

ESCALATION_DECISIONS = Counter(
    "lifeline_cutover_escalation_decisions", "Decisions of the escalation ladder, by action, fault scope and tier",
    ["action", "fault_scope", "tier"])
ABORT_REQUESTS = Counter("lifeline_cutover_abort_requests", "Operators' aborts of running cutovers, by what they did",
                         ["outcome"])
GATE_CHANGES = Counter("lifeline_cutover_gate_changes", "Writes to the cutover stop switch, by the state written",
                       ["to"])
