"""Settings of KV replication, read once by the Celery app (`LIFELINE_REPLICATION_…`).

A class of its own rather than more keys on ControlPlaneSettings: the
processes that run replication tasks (worker, beat) read it, and the API
process reads the `metrics_…` bounds of its `/metrics` at start-up. A bad value
stops start-up with pydantic's message, which names the key.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ReplicationSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LIFELINE_REPLICATION_", extra="forbid")

    # How often beat sweeps the policies: a critical policy is replicated at every sweep, an interactive
    # one once its every_seconds has passed. The sweep interval bounds a critical class's lag from below.
    sweep_every: timedelta = timedelta(seconds=5)
    # A policy whose last sweep's copies are still pending is not planned again until this has passed
    # (controlplane.replication.service.is_due): a long copy is not queued twice by the next sweep.
    replan_after: timedelta = timedelta(minutes=2)
    # A sweep reads at most this many source manifests it has not read before, and at most this many session
    # records that changed since it last read them (what it learnt is kept in an LRU of sweep_age_cache_size
    # keys per worker process, manifests and records together): a backlog is planned a share at a time.
    sweep_max_reads: int = Field(1024, ge=1, le=1_000_000)
    sweep_age_cache_size: int = Field(100_000, ge=1, le=10_000_000)
    # The Celery queue replication tasks go to (workers consume it with `-Q`).
    queue: str = Field("lifeline.replication", min_length=1, max_length=200)
    # A failed copy is retried by Celery after base * 2**attempt seconds (full jitter), at most max.
    retry_backoff: timedelta = timedelta(seconds=2)
    retry_backoff_max: timedelta = timedelta(minutes=2)
    # A worker serves its Prometheus metrics (controlplane/replication/metrics.py) on 127.0.0.1 at this port.
    metrics_port: int | None = Field(None, ge=1, le=65535)
    # The API's /metrics probes each policy's stores at most once per this (controlplane/replication/exposition.py)
    # and reads at most this many manifests it has not read before per probe.
    metrics_probe_ttl: timedelta = timedelta(seconds=30)
    metrics_probe_max_reads: int = Field(256, ge=1, le=100_000)
    # A scrape waits at most this for those reads (a silent database or store), then answers without them.
    metrics_budget: timedelta = timedelta(seconds=5)
