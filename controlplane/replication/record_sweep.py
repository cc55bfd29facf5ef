"""One sweep of a source store's session records for every due policy that replicates from it.

The records of a store are read once per sweep, not once per policy: the
beat's sweep sends one `lifeline.replication.records` task per source store
(`by_source_store`) with the due policies on it, and `sync_store` reads the
store's changed records once (`session_records.read_source`, capped, cached in
the worker's `flows.ReadCache`) and then plans and writes each policy's share
(`plan_records`, `write_records`). Apart from the checkpoints' planning
(`tasks.plan`), so a store that fails here costs the records that sweep, never
the checkpoint copies already queued; invalid records are skipped, logged and
counted; records deferred by the cap are the worker's
`lifeline_replication_pending_session_records` until a later sweep reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from common.clock import Clock
from common.logs import get_logger
from contract.kv_checkpoint import KVStoreUnavailable, open_kv_store
from controlplane.db import session_scope
from controlplane.replication import metrics, repository, service, session_records
from controlplane.replication.flows import ReadCache
from controlplane.replication.schemas import ReplicationMode

log = get_logger(__name__)


def by_source_store(factory: Any, policy_ids: Sequence[int], *, clock: Clock) -> list[list[int]]:
    """The ids of the policies that copy records (not rebuildable, with both stores), one list per source."""
    groups: dict[str, list[int]] = {}
    for row in _load(factory, policy_ids, clock):
        groups.setdefault(row["source"], []).append(row["id"])
    return list(groups.values())


def _load(factory: Any, policy_ids: Sequence[int], clock: Clock) -> list[dict[str, Any]]:
    with session_scope(factory) as session:
        rows = []
        for policy_id in policy_ids:
            policy = repository.get_policy_by_id(session, policy_id=policy_id)
            if policy is None or policy.mode == ReplicationMode.REBUILDABLE or not policy.source_store \
                    or not policy.destination_store:
                continue
            rows.append({"id": policy.id, "source": policy.source_store, "target": policy.destination_store,
                         "labels": {"model": policy.model, "session_class": policy.session_class},
                         "not_before": clock.wall() - policy.retention_seconds})
        return rows


def _failed(factory: Any, policy_ids: Sequence[int], labels: dict[str, str] | None, error: str) -> None:
    log.warning("session records not replicated this sweep", policy_ids=list(policy_ids), error=error,
                **(labels or {}))
    with session_scope(factory) as session:
        for policy_id in policy_ids:
            service.record_error(session, policy_id=policy_id, error=f"session records: {error}")


def sync_store(factory: Any, policy_ids: Sequence[int], *, clock: Clock, s3_endpoint_url: str | None,
               cache: ReadCache, max_reads: int | None = None) -> int:
    """Copy the session records of the policies in `policy_ids` that share one source store (a policy on
    another store is left to its own group); records written."""
    rows = _load(factory, policy_ids, clock)
    if not rows:
        return 0
    rows = [r for r in rows if r["source"] == rows[0]["source"]]
    try:
        source = open_kv_store(rows[0]["source"], s3_endpoint_url=s3_endpoint_url)
        seen = session_records.read_source(source, cache=cache, now=clock.wall(), max_reads=max_reads)
    except (KVStoreUnavailable, ValueError) as exc:
        _failed(factory, [r["id"] for r in rows], None, str(exc))
        return 0
    log.info("session records read", store=source.location, policies=len(rows), known=len(seen.facts),
             read=len(seen.fresh), deferred=len(seen.deferred))
    written = 0
    for row in rows:
        written += _sync_policy(factory, row, seen, source, clock=clock, s3_endpoint_url=s3_endpoint_url,
                                cache=cache, max_reads=max_reads)
    return written


def _sync_policy(factory: Any, row: dict[str, Any], seen: session_records.StoreRecords, source: Any, *,
                 clock: Clock, s3_endpoint_url: str | None, cache: ReadCache, max_reads: int | None) -> int:
    labels, policy_id = row["labels"], row["id"]
    try:
        target = open_kv_store(row["target"], s3_endpoint_url=s3_endpoint_url)
        scan = session_records.plan_records(seen, source, target, cache=cache, not_before=row["not_before"],
                                            now=clock.wall(), max_reads=max_reads, **labels)
        lags = session_records.write_records(target, scan, now=clock.wall())
    except (KVStoreUnavailable, ValueError) as exc:
        _failed(factory, [policy_id], labels, str(exc))
        return 0
    for bad in scan.invalid:
        metrics.SESSION_RECORDS_INVALID.labels(**labels, reason=bad.reason, side=bad.side).inc()
        log.warning("session record skipped", policy_id=policy_id, key=bad.key, reason=bad.reason, side=bad.side,
                    **labels)
    for copy in scan.copies:
        metrics.SESSION_RECORDS.labels(**labels, outcome="replicated" if copy.whole else "without_checkpoint").inc()
    for lag in lags:
        metrics.SESSION_RECORD_LAG.labels(**labels).observe(lag)
    metrics.PENDING_SESSION_RECORDS.labels(**labels).set(scan.unread)
    if lags:
        with session_scope(factory) as session:
            service.record_session_records(session, policy_id=policy_id, lag_seconds=max(lags), clock=clock)
    if scan.copies or scan.unread:
        log.info("session records replicated", policy_id=policy_id, records=len(scan.copies),
                 without_checkpoint=sum(not c.whole for c in scan.copies), deferred=scan.unread,
                 max_lag_seconds=max(lags, default=None), **labels)
    return len(scan.copies)
