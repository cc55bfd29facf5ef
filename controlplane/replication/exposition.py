"""Replication lag and RPO_context on the control plane's own `/metrics`, computed at scrape time.

The worker's metrics (controlplane/replication/metrics.py) live in the worker's
process, which a scraper of the API may not reach and which says nothing when
the worker or the beat is dead. This collector answers from the truth instead:
the database (policies, what the workers recorded, dead letters) and the two
stores of each policy, per model, session class and destination (redacted):

    lifeline_controlplane_replication_rpo_context_seconds       the declared target
    lifeline_controlplane_replication_pending_checkpoints       at the source, not at the destination, within
                                                                retention, not dead or cleared (store probe)
    lifeline_controlplane_replication_pending_session_records   session records of the class whose turn the
                                                                destination lacks, and those the probe's cap
                                                                left unread (store probe; session_records.py)
    lifeline_controlplane_replication_session_records_invalid   records the probe skipped as not records
                                                                (oversized, malformed, misplaced; either store)
    lifeline_controlplane_replication_oldest_pending_age_seconds  now - the oldest pending checkpoint's created_at
                                                                or session record's recorded_at (0 with none)
    lifeline_controlplane_replication_lag_seconds               the oldest pending one's age, or with none
                                                                pending the last copy's lag (as the status API)
    lifeline_controlplane_replication_lag_rpo_ratio             lag / rpo_context_seconds (> 1: target missed)
    lifeline_controlplane_replication_within_rpo                1 or 0
    lifeline_controlplane_replication_last_copy_lag_seconds     the last verified copy's lag (database)
    lifeline_controlplane_replication_last_sweep_age_seconds    now - the last sweep (a dead beat shows here)
    lifeline_controlplane_replication_{replicated,blocks_copied,deleted}_total   the workers' counts (database)
    lifeline_controlplane_replication_dead_letters{state}       dead | retrying | cleared
    lifeline_controlplane_replication_probe_ok                  0: a store did not answer (no age then)
    lifeline_controlplane_replication_probe_age_seconds         how old the probe behind these numbers is
    lifeline_controlplane_replication_probe_truncated           1: the probe hit its read cap (age a lower bound)
    lifeline_controlplane_replication_scrape_ok                 0: the database did not answer (nothing else)

Bounded cost. The database part is a few queries per policy. A store probe
lists each store's manifests (one LIST / SCAN / readdir each, as every sweep
does) and reads at most `max_reads` manifests it has not read before (their
`created_at` and class are kept in an LRU of `age_cache_size` keys, so a backlog
is read once, a few hundred at a time, not at every scrape); likewise at most
`max_reads` session records that changed since it last read them. A probe is kept for
`probe_ttl` (30 s): scraping more often than that costs the stores nothing,
and a store that does not answer costs one timeout per TTL. Probes run under
one lock, so concurrent scrapes never probe twice.

Bounded time (controlplane/bounded_scrape.py). The reads run on a thread of
their own and a scrape waits for them at most `budget` (5 s): past it the page
answers with `…_scrape_ok 0` and the request metrics; no second read starts
while that one still holds the thread. So `/metrics` keeps answering while the
database or a store is silent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from common.clock import Clock
from common.logs import get_logger
from contract.kv_checkpoint import KVCheckpointError, KVCheckpointStore, redact_kv_store_url
from controlplane.bounded_scrape import BoundedCollector
from controlplane.db import session_scope
from controlplane.replication import flows, repository, service, session_records
from controlplane.replication.config import ReplicationSettings
from controlplane.replication.schemas import ReplicationMode

log = get_logger(__name__)

PREFIX = "lifeline_controlplane_replication_"
LABELS = ["model", "session_class", "destination"]


@dataclass(frozen=True)
class StoreProbe:
    taken_at: float  # the clock's monotonic seconds
    ok: bool
    pending: int = 0  # checkpoints
    pending_records: int = 0  # session records whose turn the destination lacks
    oldest_pending_created_at: float | None = None  # of either
    truncated: bool = False
    invalid_records: int = 0  # session records skipped as not records, in either store


@dataclass(frozen=True)
class _PolicyRow:
    """What one scrape read from the database about one policy, detached from the session."""

    id: int
    revision: int
    labels: tuple[str, str, str]
    mode: str
    rpo_context_seconds: int
    retention_seconds: int
    source_store: str | None
    destination_store: str | None
    skip: frozenset[str]
    last_sweep_at: float | None
    last_lag_seconds: float | None
    replicated_total: int
    blocks_copied_total: int
    deleted_total: int
    dead_letters: dict[str, int]


class ReplicationCollector(BoundedCollector):
    """A prometheus_client collector: registered on the app's registry by create_app."""

    def __init__(self, session_factory: Any, *, clock: Clock, s3_endpoint_url: str | None,
                 probe_ttl: timedelta = timedelta(seconds=30), max_reads: int = 256, age_cache_size: int = 100_000,
                 budget: timedelta = timedelta(seconds=5),
                 open_store: Callable[[str], KVCheckpointStore] | None = None) -> None:
        super().__init__(PREFIX, budget=budget)
        self.session_factory = session_factory
        self.clock = clock
        self.probe_ttl = probe_ttl.total_seconds()
        self.max_reads = max_reads
        self._open = open_store or (lambda url: flows.open_checkpoints(url, s3_endpoint_url=s3_endpoint_url))
        self._ages = flows.ReadCache(age_cache_size)
        self._probes: dict[tuple[int, int], StoreProbe] = {}
        self._lock = threading.Lock()
        self.probes_taken = 0  # how many times the stores were listed: the cost a test can count

    def read(self) -> list[Metric]:
        return self._families(self._rows())

    # -- reading ------------------------------------------------------------------------------------

    def _rows(self) -> list[_PolicyRow]:
        rows = []
        with session_scope(self.session_factory) as session:
            counts = repository.dead_letter_counts(session)
            for policy in repository.list_policies(session):
                status = repository.get_status(session, policy_id=policy.id)
                destination = redact_kv_store_url(policy.destination_store) if policy.destination_store else ""
                rows.append(_PolicyRow(
                    id=policy.id, revision=policy.revision,
                    labels=(policy.model, policy.session_class, destination), mode=policy.mode,
                    rpo_context_seconds=policy.rpo_context_seconds, retention_seconds=policy.retention_seconds,
                    source_store=policy.source_store, destination_store=policy.destination_store,
                    skip=frozenset(service.dead_lettered_keys(session, policy_id=policy.id)),
                    last_sweep_at=status.last_sweep_at.timestamp() if status and status.last_sweep_at else None,
                    last_lag_seconds=status.last_lag_seconds if status else None,
                    replicated_total=status.replicated_total if status else 0,
                    blocks_copied_total=status.blocks_copied_total if status else 0,
                    deleted_total=status.deleted_total if status else 0,
                    dead_letters={state: n for (pid, state), n in counts.items() if pid == policy.id}))
        return rows

    def probe(self, row: _PolicyRow) -> StoreProbe:
        """The stores' view of one policy, from the cache while it is younger than the TTL."""
        with self._lock:
            cached = self._probes.get((row.id, row.revision))
            if cached is not None and self.clock.now() - cached.taken_at < self.probe_ttl:
                return cached
            fresh = self._probe_stores(row)
            self._probes = {k: v for k, v in self._probes.items() if k[0] != row.id}
            self._probes[(row.id, row.revision)] = fresh
            return fresh

    def _probe_stores(self, row: _PolicyRow) -> StoreProbe:
        taken_at = self.clock.now()
        self.probes_taken += 1
        if not row.source_store or not row.destination_store:  # a rebuildable policy: nothing to probe
            return StoreProbe(taken_at=taken_at, ok=True)
        not_before = self.clock.wall() - row.retention_seconds
        try:
            source, target = self._open(row.source_store), self._open(row.destination_store)
            scan = flows.scan_pending(source, target, skip=row.skip, not_before=not_before, ages=self._ages,
                                      max_reads=self.max_reads, source_id=row.source_store,
                                      session_class=row.labels[1])
            now = self.clock.wall()
            seen = session_records.read_source(source.store, cache=self._ages, now=now, max_reads=self.max_reads)
            records = session_records.plan_records(seen, source.store, target.store, cache=self._ages,
                                                   model=row.labels[0], session_class=row.labels[1],
                                                   not_before=not_before, now=now, max_reads=self.max_reads)
        except (KVCheckpointError, ValueError, OSError) as exc:
            log.warning("replication metrics: a store did not answer", policy_id=row.id, error=str(exc))
            return StoreProbe(taken_at=taken_at, ok=False)
        oldest = [t for t in (scan.oldest_created_at, records.oldest_recorded_at) if t is not None]
        return StoreProbe(taken_at=taken_at, ok=True, pending=scan.count,
                          pending_records=len(records.pending) + records.unread,  # unread: pending until read
                          oldest_pending_created_at=min(oldest, default=None),
                          truncated=scan.unread > 0 or records.unread > 0,
                          invalid_records=len(records.invalid))

    # -- exposition ---------------------------------------------------------------------------------

    def _families(self, rows: list[_PolicyRow]) -> list[Metric]:
        def gauge(name: str, text: str, labels: list[str] | None = None) -> GaugeMetricFamily:
            return GaugeMetricFamily(PREFIX + name, text, labels=labels or LABELS)

        def counter(name: str, text: str) -> CounterMetricFamily:
            return CounterMetricFamily(PREFIX + name, text, labels=LABELS)

        rpo = gauge("rpo_context_seconds", "Declared RPO_context target of the policy")
        pending = gauge("pending_checkpoints", "Checkpoints at the source not yet at the destination (store probe)")
        pending_records = gauge("pending_session_records", "Session records whose turn the destination lacks "
                                "(store probe)")
        invalid_records = gauge("session_records_invalid", "Session records the probe skipped as oversized, "
                                "malformed or misplaced (either store)")
        oldest = gauge("oldest_pending_age_seconds", "Age of the oldest pending checkpoint or session record "
                       "(store probe; 0: none)")
        lag = gauge("lag_seconds", "Oldest pending checkpoint's age, or the last copy's lag with none pending")
        ratio = gauge("lag_rpo_ratio", "lag_seconds / rpo_context_seconds (above 1: the target is missed)")
        within = gauge("within_rpo", "1 while lag_seconds <= rpo_context_seconds")
        last_lag = gauge("last_copy_lag_seconds", "Lag of the last verified copy (database)")
        sweep_age = gauge("last_sweep_age_seconds", "Seconds since the policy's last sweep")
        replicated = counter("replicated", "Verified copies (database)")
        blocks = counter("blocks_copied", "KV blocks written to the destination (database)")
        deleted = counter("deleted", "Destination checkpoints deleted by retention (database)")
        letters = gauge("dead_letters", "Dead letters by state", [*LABELS, "state"])
        probe_ok = gauge("probe_ok", "1: both stores answered the probe behind these numbers")
        probe_age = gauge("probe_age_seconds", "Age of the cached store probe")
        truncated = gauge("probe_truncated", "1: the probe hit its read cap; the oldest age is a lower bound")
        now_wall = self.clock.wall()
        for row in rows:
            labels = list(row.labels)
            rpo.add_metric(labels, row.rpo_context_seconds)
            replicated.add_metric(labels, row.replicated_total)
            blocks.add_metric(labels, row.blocks_copied_total)
            deleted.add_metric(labels, row.deleted_total)
            for state in ("dead", "retrying", "cleared"):
                letters.add_metric([*labels, state], row.dead_letters.get(state, 0))
            if row.last_lag_seconds is not None:
                last_lag.add_metric(labels, row.last_lag_seconds)
            if row.last_sweep_at is not None:
                sweep_age.add_metric(labels, max(0.0, now_wall - row.last_sweep_at))
            if row.mode == ReplicationMode.REBUILDABLE or not row.source_store or not row.destination_store:
                continue
            probe = self.probe(row)
            probe_ok.add_metric(labels, 1 if probe.ok else 0)
            probe_age.add_metric(labels, max(0.0, self.clock.now() - probe.taken_at))
            if not probe.ok:
                continue
            truncated.add_metric(labels, 1 if probe.truncated else 0)
            pending.add_metric(labels, probe.pending)
            pending_records.add_metric(labels, probe.pending_records)
            invalid_records.add_metric(labels, probe.invalid_records)
            age = (max(0.0, now_wall - probe.oldest_pending_created_at)
                   if probe.oldest_pending_created_at is not None else 0.0)
            oldest.add_metric(labels, age)
            measured = service.lag_seconds(pending=probe.pending + probe.pending_records,
                                           oldest_pending_created_at=probe.oldest_pending_created_at,
                                           last_lag_seconds=row.last_lag_seconds, now=now_wall)
            if measured is None:
                continue
            lag.add_metric(labels, measured)
            within.add_metric(labels, 1 if measured <= row.rpo_context_seconds else 0)
            if row.rpo_context_seconds > 0:
                ratio.add_metric(labels, measured / row.rpo_context_seconds)
        return [rpo, pending, pending_records, invalid_records, oldest, lag, ratio, within, last_lag, sweep_age,
                replicated, blocks, deleted, letters, probe_ok, probe_age, truncated]


def build_collector(*, session_factory: Any, clock: Clock, s3_endpoint_url: str | None,
                    settings: ReplicationSettings | None = None) -> ReplicationCollector:
    """The collector create_app registers, with the probe bounds of `LIFELINE_REPLICATION_METRICS_…`."""
    settings = settings or ReplicationSettings()
    return ReplicationCollector(session_factory, clock=clock, s3_endpoint_url=s3_endpoint_url,
                                probe_ttl=settings.metrics_probe_ttl, max_reads=settings.metrics_probe_max_reads,
                                budget=settings.metrics_budget)
