"""Prometheus metrics of the processes that replicate (the Celery worker), in the default registry.

    lifeline_replication_copies_total{model,session_class,outcome}   replicated | already_present | retried |
                                                                     dead_lettered
    lifeline_replication_blocks_copied_total{model,session_class}    blocks written to a destination
    lifeline_replication_lag_seconds{model,session_class}            histogram: a checkpoint's creation at the
                                                                     source → its verified presence at the destination
    lifeline_replication_last_lag_seconds{model,session_class}       the same, of the last one replicated
    lifeline_replication_pending_checkpoints{model,session_class}    at the last sweep: at the source, not yet at
                                                                     the destination (dead letters excluded)
    lifeline_replication_deleted_checkpoints_total{model,session_class}  removed by retention at the destination
    lifeline_replication_session_records_total{model,session_class,outcome}   session records written to a
                                                                     destination: replicated (whole) |
                                                                     without_checkpoint (its KV not there yet)
    lifeline_replication_session_record_lag_seconds{model,session_class}     histogram: a turn's record at the
                                                                     source → its copy at the destination
    lifeline_replication_pending_session_records{model,session_class}      at the last sweep: records deferred
                                                                     past the read cap (pending, unread)
    lifeline_replication_session_records_invalid_total{model,session_class,reason,side}   skipped records:
                                                                     oversized | malformed | misplaced, at the
                                                                     source | destination

`lifeline replication worker --metrics-port N` serves them; the control
plane's `GET /api/v1/replication/status` shows the same lag and pending
count from the database, and its own `GET /metrics` computes lag against
RPO_context from the database and the stores at scrape time
(`lifeline_controlplane_replication_*`, controlplane/replication/exposition.py),
so a scraper that cannot reach the worker, or a dead worker, still shows.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LABELS = ["model", "session_class"]

COPIES = Counter("lifeline_replication_copies_total", "KV checkpoint copies by outcome", [*LABELS, "outcome"])
BLOCKS = Counter("lifeline_replication_blocks_copied_total", "KV blocks written to a destination store", LABELS)
LAG = Histogram("lifeline_replication_lag_seconds", "KV checkpoint creation at the source to verified presence "
                "at the destination", LABELS, buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900, 3600))
LAST_LAG = Gauge("lifeline_replication_last_lag_seconds", "Replication lag of the last checkpoint replicated",
                 LABELS)
PENDING = Gauge("lifeline_replication_pending_checkpoints", "KV checkpoints at the source not yet at the "
                "destination, at the last sweep", LABELS)
DELETED = Counter("lifeline_replication_deleted_checkpoints_total", "KV checkpoints deleted by retention", LABELS)
SESSION_RECORDS = Counter("lifeline_replication_session_records_total", "Session records written to a "
                          "destination store, whole or without their checkpoint claim", [*LABELS, "outcome"])
SESSION_RECORD_LAG = Histogram("lifeline_replication_session_record_lag_seconds", "A session turn's record at the "
                               "source to its copy at the destination", LABELS,
                               buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900, 3600))
PENDING_SESSION_RECORDS = Gauge("lifeline_replication_pending_session_records", "Session records the last sweep "
                                "deferred past its read cap (pending; unread ones of unknown class count for "
                                "every policy on the store)", LABELS)
SESSION_RECORDS_INVALID = Counter("lifeline_replication_session_records_invalid_total", "Session records a sweep "
                                  "skipped as oversized, malformed or misplaced", [*LABELS, "reason", "side"])
