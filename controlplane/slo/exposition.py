"""Each SLO target and whether a drill verified it, on the control plane's `/metrics` at scrape time.

The SLO document (`service.build`) is computed on request; an alert needs its
verdicts as series. Per model (those the catalog or a drill definition
names) and per figure that declares a target:

    lifeline_controlplane_slo_target{model,metric}            the declared target (the figure's unit)
    lifeline_controlplane_slo_measured{model,metric}          what the evidence measured (absent: nothing)
    lifeline_controlplane_slo_target_verified{model,metric}   1: a fresh, passed drill run measured it within
                                                              target (the document's `measured`); 0: unverified
                                                              or missed, the document's `why` says which
    lifeline_controlplane_slo_scrape_ok                       0: the database did not answer

The same function builds the document and these series, so they cannot
disagree. One document per model per scrape, bounded in time
(controlplane/bounded_scrape.py).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from common.clock import Clock
from controlplane.bounded_scrape import BoundedCollector
from controlplane.db import session_scope
from controlplane.drill import repository as drill_repository
from controlplane.slo import service
from controlplane.slo.triple import DnsTtls
from weight_catalog import repository as catalog_repository

PREFIX = "lifeline_controlplane_slo_"
LABELS = ["model", "metric"]


class SloCollector(BoundedCollector):
    def __init__(self, session_factory: Any, *, clock: Clock, gateway_stale_after: timedelta,
                 agent_stale_after: timedelta, dns: DnsTtls | None,
                 budget: timedelta = timedelta(seconds=5)) -> None:
        super().__init__(PREFIX, budget=budget)
        self.session_factory = session_factory
        self.clock = clock
        self.stale_after = {"gateway_stale_after": gateway_stale_after, "agent_stale_after": agent_stale_after}
        self.dns = dns

    def read(self) -> list[Metric]:
        target = GaugeMetricFamily(PREFIX + "target", "Declared SLO target (the figure's unit)", labels=LABELS)
        measured = GaugeMetricFamily(PREFIX + "measured", "What the evidence measured for the target",
                                     labels=LABELS)
        verified = GaugeMetricFamily(PREFIX + "target_verified", "1: a fresh, passed drill run measured the "
                                     "target within it; 0: unverified or missed", labels=LABELS)
        with session_scope(self.session_factory) as session:
            models = sorted({v.model for v in catalog_repository.list_versions(session)}
                            | {d.model for d in drill_repository.list_definitions(session)})
            for model in models:
                document = service.build(session, model=model, clock=self.clock, dns=self.dns, **self.stale_after)
                for entry in document.triple:
                    for figure in entry.figures:
                        if figure.target is None:
                            continue
                        labels = [model, figure.metric]
                        target.add_metric(labels, figure.target)
                        verified.add_metric(labels, 1 if figure.status == "measured" else 0)
                        if figure.measured is not None:
                            measured.add_metric(labels, figure.measured)
        return [target, measured, verified]
