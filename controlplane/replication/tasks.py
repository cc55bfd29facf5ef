"""Celery tasks of KV replication, registered on the control plane's Celery app by `register`.

    lifeline.replication.sweep       beat, every `LIFELINE_REPLICATION_SWEEP_EVERY` (5 s): one replicate
                                     task per policy that is due (critical: every sweep; interactive:
                                     every `every_seconds`; rebuildable: never), and one records task per
                                     source store those policies share
    lifeline.replication.replicate   one policy: list the source's checkpoints of its class (or unclassed)
                                     the destination lacks, send one copy task for each (reading at most
                                     `sweep_max_reads` manifests not read before), apply retention at the
                                     destination
    lifeline.replication.records     one source store: its session records, read once for the due policies
                                     on it (record_sweep.py; a record claims a checkpoint at the destination
                                     only once that is there)
    lifeline.replication.copy        one checkpoint: copy, verify at both ends (flows.copy_verified)

A copy is acknowledged late and rejected when its worker dies, so a worker
SIGKILLed mid-copy leaves the message on the broker and another worker (or
the same one restarted) runs it again; the copy is idempotent and writes
the manifest last. A copy that fails (a store that does not answer, a block
that does not match its manifest) is retried by Celery's own `retry` with
exponential backoff and full jitter; after the policy's `max_attempts` it is
dead-lettered: a row the status API shows and a `replication.dead_letter`
event, and later sweeps skip it until an operator retries it (it is then
planned again with the policy's attempts afresh, and deleted once copied) or
clears it (states.py). The stores are the truth: every sweep
plans again from what they hold, so a task lost to a database outage is
planned again at the next one.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from celery import Celery
from celery.utils.time import get_exponential_backoff_interval
from celery.schedules import schedule

from common.clock import Clock
from common.logs import get_logger
from contract.kv_checkpoint import KVCheckpointInvalid, KVStoreUnavailable
from controlplane.db import session_scope
from controlplane.replication import flows, metrics, record_sweep, repository, service
from controlplane.replication.config import ReplicationSettings
from controlplane.replication.schemas import ReplicationMode

log = get_logger(__name__)

SWEEP = "lifeline.replication.sweep"
REPLICATE = "lifeline.replication.replicate"
RECORDS = "lifeline.replication.records"
COPY = "lifeline.replication.copy"
SWEEP_ENTRY = "replication-sweep"
RETRIED = (KVStoreUnavailable, KVCheckpointInvalid, ValueError)


def _labels(policy: Any) -> dict[str, str]:
    return {"model": policy.model, "session_class": policy.session_class}


def sweep_due(factory: Any, *, clock: Clock, replan_after: timedelta | None = None) -> list[int]:
    """Ids of the policies due for replication now."""
    with session_scope(factory) as session:
        return [p.id for p in service.due_policies(session, clock=clock, replan_after=replan_after)]


def plan(factory: Any, policy_id: int, *, clock: Clock, s3_endpoint_url: str | None,
         ages: flows.ReadCache | None = None, max_reads: int | None = None) -> list[str]:
    """Record a sweep of one policy and apply its retention; the keys of the checkpoints to copy.

    At most `max_reads` source manifests not yet in `ages` are read: a backlog past that is planned over
    the next sweeps. The recorded `pending` is what this sweep queued (is_due waits for it to settle), so
    the next sweep comes as soon as this share is copied; the whole backlog is on the API's /metrics.
    """
    with session_scope(factory) as session:
        policy = repository.get_policy_by_id(session, policy_id=policy_id)
        if policy is None or policy.mode == ReplicationMode.REBUILDABLE or not policy.source_store:
            return []
        source_url, target_url, labels = policy.source_store, policy.destination_store or "", _labels(policy)
        not_before = clock.wall() - policy.retention_seconds
        skip = service.dead_lettered_keys(session, policy_id=policy_id)
    try:
        source = flows.open_checkpoints(source_url, s3_endpoint_url=s3_endpoint_url)
        target = flows.open_checkpoints(target_url, s3_endpoint_url=s3_endpoint_url)
        scan = flows.scan_pending(source, target, skip=skip, not_before=not_before, ages=ages,
                                  max_reads=max_reads, source_id=source_url, session_class=labels["session_class"])
        pending = scan.pending
        deleted = flows.apply_retention(target, not_before=not_before)
    except (KVStoreUnavailable, ValueError) as exc:
        log.warning("replication sweep failed", policy_id=policy_id, error=str(exc), **labels)
        with session_scope(factory) as session:
            service.record_error(session, policy_id=policy_id, error=f"sweep: {exc}")
        return []
    with session_scope(factory) as session:
        service.record_sweep(session, policy_id=policy_id, pending=len(pending),
                             oldest_pending_created_at=scan.oldest_created_at, clock=clock)
        service.record_deleted(session, policy_id=policy_id, deleted=deleted)
    metrics.PENDING.labels(**labels).set(scan.count)
    if deleted:
        metrics.DELETED.labels(**labels).inc(deleted)
    log.info("replication swept", policy_id=policy_id, planned=len(pending), unread=scan.unread, deleted=deleted,
             **labels)
    return [p.key for p in pending]


def copy(factory: Any, policy_id: int, key: str, *, clock: Clock, s3_endpoint_url: str | None) -> str:
    """Copy one checkpoint, verified; the outcome. Raises one of RETRIED when it should be tried again."""
    with session_scope(factory) as session:
        policy = repository.get_policy_by_id(session, policy_id=policy_id)
        if policy is None or not policy.source_store or not policy.destination_store:
            return "no_policy"
        if service.is_dead_lettered(session, policy_id=policy_id, key=key):
            return "dead_lettered"
        source_url, target_url, labels = policy.source_store, policy.destination_store, _labels(policy)
    source = flows.open_checkpoints(source_url, s3_endpoint_url=s3_endpoint_url)
    target = flows.open_checkpoints(target_url, s3_endpoint_url=s3_endpoint_url)
    outcome = flows.copy_verified(source, target, key)
    if outcome.already_present:
        with session_scope(factory) as session:
            service.record_already_present(session, policy_id=policy_id)
            service.record_letter_copied(session, policy_id=policy_id, key=key, clock=clock)
        metrics.COPIES.labels(**labels, outcome="already_present").inc()
        return "already_present"
    lag = max(0.0, clock.wall() - outcome.created_at) if outcome.created_at is not None else None
    with session_scope(factory) as session:
        service.record_replicated(session, policy_id=policy_id, blocks=outcome.blocks, lag_seconds=lag, clock=clock)
        service.record_letter_copied(session, policy_id=policy_id, key=key, clock=clock)
    metrics.COPIES.labels(**labels, outcome="replicated").inc()
    metrics.BLOCKS.labels(**labels).inc(outcome.blocks)
    if lag is not None:
        metrics.LAG.labels(**labels).observe(lag)
        metrics.LAST_LAG.labels(**labels).set(lag)
    log.info("kv checkpoint replicated", policy_id=policy_id, checkpoint=key, blocks=outcome.blocks,
             lag_seconds=lag, **labels)
    return "replicated"


def failed(factory: Any, policy_id: int, key: str, *, attempt: int, error: Exception, clock: Clock) -> bool:
    """Record a failed attempt; True when it was the last (dead-lettered), False when it is to be retried."""
    message = f"{type(error).__name__}: {error}"
    with session_scope(factory) as session:
        policy = repository.get_policy_by_id(session, policy_id=policy_id)
        if policy is None:
            return True
        labels, last = _labels(policy), attempt >= policy.max_attempts
        if last:
            service.record_dead_letter(session, policy_id=policy_id, key=key, attempts=attempt, error=message,
                                       clock=clock)
        else:
            service.record_error(session, policy_id=policy_id, error=f"{key}: {message}")
    metrics.COPIES.labels(**labels, outcome="dead_lettered" if last else "retried").inc()
    log.warning("kv checkpoint dead-lettered" if last else "kv checkpoint copy failed; retrying",
                policy_id=policy_id, checkpoint=key, attempt=attempt, error=message, **labels)
    return last


def register(app: Celery, *, factory: Callable[[], Any], clock: Clock, s3_endpoint_url: str | None,
             settings: ReplicationSettings) -> None:
    """Add the replication tasks, their queue and the beat's sweep to `app` (controlplane.celery_app).

    `factory()` gives the session factory, built on first use (nothing is built at import or registration).
    """
    queue = settings.queue
    app.conf.task_routes = {**dict(app.conf.task_routes or {}), "lifeline.replication.*": {"queue": queue}}
    app.conf.beat_schedule = {**dict(app.conf.beat_schedule or {}), SWEEP_ENTRY: {
        "task": SWEEP, "schedule": schedule(run_every=settings.sweep_every, nowfun=clock.utcnow)}}
    if settings.metrics_port is not None:
        from celery.signals import worker_init
        from prometheus_client import start_http_server

        port = settings.metrics_port

        def serve_metrics(**_: Any) -> None:  # in the worker's process only, never in an API process
            start_http_server(port, addr="127.0.0.1")

        worker_init.connect(serve_metrics, weak=False)
    ages = flows.ReadCache(settings.sweep_age_cache_size)  # per worker process
    backoff = max(0, int(settings.retry_backoff.total_seconds()))
    backoff_max = max(backoff, int(settings.retry_backoff_max.total_seconds()))

    @app.task(name=SWEEP, shared=False)
    def sweep_task() -> list[int]:
        due = sweep_due(factory(), clock=clock, replan_after=settings.replan_after)
        for policy_id in due:
            replicate_task.apply_async((policy_id,), queue=queue)
        for group in record_sweep.by_source_store(factory(), due, clock=clock):  # one read of each store
            records_task.apply_async((group,), queue=queue)
        return due

    @app.task(name=REPLICATE, shared=False)
    def replicate_task(policy_id: int) -> int:
        keys = plan(factory(), policy_id, clock=clock, s3_endpoint_url=s3_endpoint_url, ages=ages,
                    max_reads=settings.sweep_max_reads)
        for key in keys:
            copy_task.apply_async((policy_id, key), queue=queue)
        return len(keys)

    @app.task(name=RECORDS, shared=False)
    def records_task(policy_ids: list[int]) -> int:
        return record_sweep.sync_store(factory(), policy_ids, clock=clock, s3_endpoint_url=s3_endpoint_url,
                                       cache=ages, max_reads=settings.sweep_max_reads)

    # acks_late + reject_on_worker_lost: a worker killed mid-copy returns the message to the broker.
    @app.task(name=COPY, bind=True, shared=False, acks_late=True, reject_on_worker_lost=True, max_retries=None)
    def copy_task(self: Any, policy_id: int, key: str) -> str:
        try:
            return copy(factory(), policy_id, key, clock=clock, s3_endpoint_url=s3_endpoint_url)
        except RETRIED as exc:
            attempt = self.request.retries + 1
            if failed(factory(), policy_id, key, attempt=attempt, error=exc, clock=clock):
                return "dead_lettered"
            countdown = get_exponential_backoff_interval(backoff, attempt - 1, backoff_max, full_jitter=True)
            raise self.retry(exc=exc, countdown=countdown, queue=queue) from None
