"""Prometheus metrics of drill runs (the process's default registry: the worker or CLI that runs them).

    lifeline_drill_runs_total{scope,fault,outcome}   outcome: passed | failed | aborted | refused | error
    lifeline_drill_faults_injected_total{fault}
    lifeline_drill_last_measured{drill,metric}       the latest value each drill measured (s, tokens, requests)
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

RUNS = Counter("lifeline_drill_runs_total", "Drill runs ended, by scope, fault and outcome",
               ["scope", "fault", "outcome"])
FAULTS = Counter("lifeline_drill_faults_injected_total", "Faults a drill injected", ["fault"])
MEASURED = Gauge("lifeline_drill_last_measured", "The latest figure each drill measured", ["drill", "metric"])
