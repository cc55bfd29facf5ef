"""A scrape-time collector whose database reads are bounded in time, so `/metrics` answers whatever the database does.

The collectors the control plane computes from its own database (replication
lag and RPO_context, cutovers by state) share this: the reads run on one
thread of the collector's own, and a scrape waits for them at most `budget`.
Past it, or when the database raises, the page carries `<prefix>scrape_ok 0`
and nothing else of this collector's (the alerts on it then see no data and
the `…MetricsUnread` alert sees the 0). A scrape during a read that is still
going waits on that one rather than starting another, so a silent database
holds at most one thread; a scrape after it ended starts a fresh read, so a
late result is never served as a current one.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Iterable, Iterator
from datetime import timedelta

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from sqlalchemy.exc import SQLAlchemyError

from common.logs import get_logger

log = get_logger(__name__)


class BoundedCollector:
    """A prometheus_client collector: subclasses say what `read()` returns; this bounds when it runs."""

    def __init__(self, prefix: str, *, budget: timedelta = timedelta(seconds=5)) -> None:
        self.prefix = prefix
        self.budget = budget.total_seconds()
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=prefix.rstrip("_"))
        self._flight_lock = threading.Lock()
        self._in_flight: concurrent.futures.Future[list[Metric]] | None = None

    def read(self) -> list[Metric]:
        """The families, from the database (SQLAlchemyError: it did not answer)."""
        raise NotImplementedError

    def describe(self) -> Iterable[Metric]:
        """No families up front: registering must not read the database (nothing is done at build time)."""
        return []

    def collect(self) -> Iterator[Metric]:
        with self._flight_lock:
            if self._in_flight is None or self._in_flight.done():
                self._in_flight = self._executor.submit(self._gather)
            future = self._in_flight
        try:
            families = future.result(timeout=self.budget)
        except Exception as exc:  # noqa: BLE001 - past the budget, or a bug: the page must still answer
            log.warning("metrics not read from the database", prefix=self.prefix, error=type(exc).__name__,
                        budget_seconds=self.budget)
            yield self._scrape_ok(0)
            return
        yield from families

    def _gather(self) -> list[Metric]:
        try:
            families = self.read()
        except SQLAlchemyError as exc:
            log.warning("metrics: the database did not answer", prefix=self.prefix, error=type(exc).__name__)
            return [self._scrape_ok(0)]
        return [self._scrape_ok(1), *families]

    def _scrape_ok(self, value: int) -> GaugeMetricFamily:
        family = GaugeMetricFamily(self.prefix + "scrape_ok", "1: the database answered this scrape")
        family.add_metric([], value)
        return family
