"""Cutovers by tier and state on the control plane's own `/metrics`, from the database at scrape time.

A cutover may be run by the API's process, by `lifeline cutover execute` in
a shell, or by the escalation ladder; a counter in any one process would miss
the others and reset with it. The database has every one:

    lifeline_controlplane_cutovers{tier,state}        cutovers in each state (all time)
    lifeline_controlplane_cutovers_unclaimed{tier}    mid-way (executing, verifying, rolling back) with no live
                                                      runner claim: routing is half moved and nothing drives it
    lifeline_controlplane_cutover_scrape_ok           0: the database did not answer (nothing else then)

`failed` is a rollback that did not verify: the tier is in neither its
before- nor its after-state until a rollback is retried and verifies
(deploy/monitoring/lifeline-rules.yaml alerts on both gauges). Two grouped
queries per scrape, bounded in time like every database collector
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
from cutover import repository
from cutover.states import ACTIVE_STATES, CutoverState

PREFIX = "lifeline_controlplane_cutover_"


class CutoverCollector(BoundedCollector):
    def __init__(self, session_factory: Any, *, clock: Clock, budget: timedelta = timedelta(seconds=5)) -> None:
        super().__init__(PREFIX, budget=budget)
        self.session_factory = session_factory
        self.clock = clock

    def read(self) -> list[Metric]:
        with session_scope(self.session_factory) as session:
            counts = repository.counts_by_tier_and_state(session)
            unclaimed = repository.unclaimed_in_flight(session, now=self.clock.utcnow())
        by_state = GaugeMetricFamily("lifeline_controlplane_cutovers", "Cutovers in each state, by tier",
                                     labels=["tier", "state"])
        tiers = sorted({tier for tier, _ in counts} | set(unclaimed))
        for tier in tiers:
            for state in CutoverState:  # every state, 0 too: an alert's `offset` compares like with like
                by_state.add_metric([tier, state.value], counts.get((tier, state.value), 0))
        orphans = GaugeMetricFamily("lifeline_controlplane_cutovers_unclaimed", "Cutovers mid-way ("
                                    + ", ".join(sorted(s.value for s in ACTIVE_STATES))
                                    + ") whose runner's claim has lapsed", labels=["tier"])
        for tier in tiers:
            orphans.add_metric([tier], unclaimed.get(tier, 0))
        return [by_state, orphans]
