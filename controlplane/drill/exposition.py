"""When each drill last passed, and when a passing run is due, on the control plane's `/metrics` at scrape time.

The SLO document states only what a drill measured, and a drill's figures
go stale by its scope's cadence (weekly instance, monthly zone, quarterly
region: `service.DEFAULT_CADENCE`, the beat's). A process-local counter
cannot say a drill has not passed for 91 days; the database can. Per drill
definition (its latest version's model and scope):

    lifeline_controlplane_drill_cadence_seconds{drill,model,scope}              how often it must pass
    lifeline_controlplane_drill_last_passed_timestamp_seconds{drill,model,scope}  when its last passing run ended
                                                                                (absent: never passed)
    lifeline_controlplane_drill_pass_due_timestamp_seconds{drill,model,scope}   last passed (or first defined)
                                                                                + cadence: past it, overdue
    lifeline_controlplane_drill_scrape_ok                                       0: the database did not answer

Three grouped queries per scrape, bounded in time (controlplane/bounded_scrape.py).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from controlplane.bounded_scrape import BoundedCollector
from controlplane.db import session_scope
from controlplane.drill import repository
from controlplane.drill.service import DEFAULT_CADENCE
from controlplane.drill.states import DrillScope

PREFIX = "lifeline_controlplane_drill_"
LABELS = ["drill", "model", "scope"]


class DrillCollector(BoundedCollector):
    def __init__(self, session_factory: Any, *, cadence: dict[DrillScope, timedelta] | None = None,
                 budget: timedelta = timedelta(seconds=5)) -> None:
        super().__init__(PREFIX, budget=budget)
        self.session_factory = session_factory
        self.cadence = cadence or DEFAULT_CADENCE

    def read(self) -> list[Metric]:
        with session_scope(self.session_factory) as session:
            definitions = [(d.name, d.model, d.scope) for d in repository.list_definitions(session)]
            defined = repository.first_defined_at(session)
            passed = repository.last_passed_at(session)
        cadence = GaugeMetricFamily(PREFIX + "cadence_seconds", "How often the drill must pass (its scope's "
                                    "cadence)", labels=LABELS)
        last = GaugeMetricFamily(PREFIX + "last_passed_timestamp_seconds", "When the drill's last passing run "
                                 "ended (Unix time)", labels=LABELS)
        due = GaugeMetricFamily(PREFIX + "pass_due_timestamp_seconds", "When a passing run is due: the last "
                                "passed (or the first definition) + cadence (Unix time)", labels=LABELS)
        for name, model, scope in definitions:
            labels = [name, model, scope]
            period = self.cadence[DrillScope(scope)].total_seconds()
            cadence.add_metric(labels, period)
            since = passed.get(name) or defined[name]
            if name in passed:
                last.add_metric(labels, passed[name].timestamp())
            due.add_metric(labels, since.timestamp() + period)
        return [cadence, last, due]
