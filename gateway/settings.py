"""Gateway configuration: a YAML file, overridden by `LIFELINE_GATEWAY_*` variables.

Nested keys use `__` in the environment (`LIFELINE_GATEWAY_RECOVERY__STALL_TIMEOUT=1.5`).
Durations are `timedelta`; YAML and the environment give them in seconds.
A missing or bad value stops start-up with a message naming the key.
"""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from common.durations import Seconds
from contract.kv_checkpoint import check_kv_store_url
from contract.snapshot import ReplicationPolicyEntry
from contract.sampling import Sampling


class RecoveryStrategy(StrEnum):
    FAIL_STOP = "fail_stop"
    RETRY_FROM_SCRATCH = "retry_from_scratch"
    TOKEN_COMMIT_RESUME = "token_commit_resume"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelConfig(_Section):
    """An alias clients name, the weight version engines serve it under, and its tokenizer."""

    alias: str
    version: str = Field(description="the engines' served model name for this weight version")
    model_dir: Path = Field(description="holds tokenizer.json and tokenizer_config.json (chat template)")
    max_model_len: int | None = Field(None, ge=1, description="default: config.json max_position_embeddings")


class EngineConfig(_Section):
    """A statically declared engine; routable without a lease only when `registry.require_lease` is off."""

    instance_id: str
    url: str
    version: str
    zone: str = "local-a"
    region: str = "local"
    sampling: Sampling = Sampling.ENGINE_DEFAULT  # position_keyed: seeded streams moved here continue exactly


class RegistryConfig(_Section):
    kind: Literal["memory", "redis"] = "memory"
    url: str | None = Field(None, description="redis://… when kind is redis")
    key_prefix: str = Field("lifeline", description="keys are {key_prefix}:{region}:… (contract.lease)")
    token: str | None = Field(None, description="bearer token engines present to the lease endpoint")
    ttl: Seconds = Field(timedelta(seconds=2), description="lease time to live; engines renew before it lapses")
    require_lease: bool = Field(True, description="static engines need a live lease to be routed to")
    refresh_interval: Seconds = Field(timedelta(milliseconds=250), description="how often a Redis view is re-read")
    state_dir: Path | None = Field(None, description="memory registry: generation counters persist here across restarts "
                                                     "(unset: derived from the boot time; gateway/lease_registry.py)")
    fail_static: Seconds = Field(timedelta(seconds=30), description="Redis registry unreadable: keep routing on the last "
                                                                    "view this long, then refuse new requests (503)")
    agent_verdicts: bool = Field(True, description="Redis registry: also route by the regional agent's verdicts, "
                                                   "published beside the leases (contract/verdict.py)")

    @model_validator(mode="after")
    def _check(self) -> RegistryConfig:
        if self.kind == "redis" and not self.url:
            raise ValueError("registry.url is required when registry.kind is redis")
        if self.ttl > timedelta(seconds=2) or self.ttl <= timedelta(0):
            raise ValueError("registry.ttl must be in (0, 2] seconds")
        return self


class TokenLogConfig(_Section):
    kind: Literal["memory", "redis"] = "memory"
    url: str | None = None
    key_prefix: str = "lifeline:stream"
    retention: Seconds = Field(timedelta(minutes=10), description="how long a finished or detached stream can be resumed")
    owner_ttl: Seconds = Field(timedelta(seconds=2), description="a replica driving a stream refreshes its ownership within this")
    outage_buffer_frames: int = Field(10000, ge=0, description="Redis log unreachable: frames held in the gateway for streams "
                                                              "in flight (0: a frame reaches the client only once in Redis)")
    admit_non_resumable: bool = Field(False, description="Redis log unreachable: admit new streams without cross-replica "
                                                         "resumability instead of refusing them (503)")

    @model_validator(mode="after")
    def _check(self) -> TokenLogConfig:
        if self.kind == "redis" and not self.url:
            raise ValueError("token_log.url is required when token_log.kind is redis")
        return self


class RecoveryConfig(_Section):
    strategy: RecoveryStrategy = RecoveryStrategy.TOKEN_COMMIT_RESUME
    max_migrations: int = Field(3, ge=0)
    connect_timeout: Seconds = timedelta(seconds=1)
    first_token_timeout: Seconds = Field(timedelta(seconds=10), description="wait for the first token: this, plus the prompt's expected prefill time")
    prefill_tokens_per_s: float = Field(2000.0, gt=0, description="expected prefill rate: the first-token wait grows by prompt tokens / this")
    stall_timeout: Seconds = Field(timedelta(seconds=2), description="no token for this long mid-stream: migrate")
    draining_silence: Seconds = Field(timedelta(milliseconds=300), description="no token for this long mid-stream "
                                      "from an engine that has left routing (lease gone, agent verdict draining): "
                                      "migrate at once instead of waiting out stall_timeout")
    request_timeout: Seconds = Field(timedelta(minutes=5), description="default deadline; X-Lifeline-Timeout-Ms overrides")
    min_deadline_remaining: Seconds = Field(timedelta(milliseconds=500), description="do not migrate with less left")
    migration_backoff: Seconds = Field(timedelta(milliseconds=100), description="before a stream's second and later "
                                       "migrations: a random wait up to this × 2^(n-2) (full jitter); the first is "
                                       "immediate")
    migration_backoff_max: Seconds = Field(timedelta(seconds=2), description="the longest such wait")

    @model_validator(mode="after")
    def _check(self) -> RecoveryConfig:
        if self.draining_silence <= timedelta(0):
            raise ValueError("recovery.draining_silence must be positive")
        return self


class OutlierConfig(_Section):
    """Local ejection of failing endpoints, as Envoy's outlier detection (gateway/outlier.py)."""

    consecutive_5xx: int = Field(3, ge=1, description="engine-answered failures in a row before an ejection")
    consecutive_local_failures: int = Field(1, ge=1, description="connection failures (refused, reset, stall, lapsed lease) in a row before an ejection")
    base_ejection_time: Seconds = Field(timedelta(seconds=5), description="the n-th ejection lasts n × this")
    max_ejection_time: Seconds = Field(timedelta(seconds=60))
    max_ejection_percent: float = Field(50.0, ge=0.0, le=100.0, description="of a version's endpoints; never the last one")


class AdmissionConfig(_Section):
    max_concurrency_per_engine: int = Field(8, ge=1)
    max_queue: int = Field(16, ge=0, description="requests waiting for an engine slot; more get 429")
    queue_timeout: Seconds = timedelta(seconds=5)
    retry_after: Seconds = timedelta(seconds=1)
    retry_budget_ratio: float = Field(0.2, ge=0.0, le=1.0, description="migrations in flight (failure → first token of the continuation) ≤ this × active requests")
    retry_budget_min: int = Field(3, ge=0, description="migrations always allowed in flight, as Envoy's min_retry_concurrency")
    hash_load_factor: float = Field(1.25, ge=1.0, description="bounded-load consistent hashing: c × mean load")
    overloaded_weight: float = Field(0.25, gt=0.0, le=1.0, description="an endpoint the regional agent found "
                                     "overloaded takes this share of a healthy one's new sessions (gateway/verdicts.py)")


class RoutingConfig(_Section):
    """Where the routing table comes from: this file (`static`) or the control plane's snapshot.

    With `snapshot`, `models` and `engines` in this file are not used for
    routing; the gateway polls `{controlplane_url}/api/v1/snapshot`, keeps
    the last good one at `cache_path` and starts from it when the control
    plane is away (invariant 7).
    """

    source: Literal["static", "snapshot"] = "static"
    controlplane_url: str | None = Field(None, description="http(s)://host:port of the control plane")
    token: str | None = Field(None, description="bearer token for the snapshot, report and event endpoints")
    region: str | None = Field(None, description="the gateway's region again, if given; it must equal the "
                                                 "top-level `region` (which names the lease registry's keys too)")
    poll_interval: Seconds = Field(timedelta(milliseconds=250), description="snapshot poll period (If-None-Match)")
    cache_path: Path | None = Field(None, description="the last good snapshot, replaced atomically on each apply")
    artifact_dir: Path | None = Field(None, description="s3:// tokenizers are downloaded here; default beside cache_path")
    s3_endpoint_url: str | None = Field(None, description="S3 API endpoint for s3:// artifact locations")
    connect_timeout: Seconds = timedelta(seconds=1)
    read_timeout: Seconds = timedelta(seconds=5)
    report_interval: Seconds = Field(timedelta(seconds=2), description="how often the replica PUTs its GatewayReport")
    event_buffer: int = Field(1000, ge=1, description="L7 events held for shipping; more are dropped and counted")
    event_flush_interval: Seconds = Field(timedelta(milliseconds=500), description="how often buffered events are POSTed")

    @model_validator(mode="after")
    def _check(self) -> RoutingConfig:
        if self.source == "snapshot":
            if not self.controlplane_url:
                raise ValueError("routing.controlplane_url is required when routing.source is snapshot")
            if self.cache_path is None:
                raise ValueError("routing.cache_path is required when routing.source is snapshot "
                                 "(the last good snapshot the gateway starts from while the control plane is away)")
        if self.poll_interval <= timedelta(0):
            raise ValueError("routing.poll_interval must be positive")
        return self


class TracingConfig(_Section):
    """OpenTelemetry spans of streams and engine attempts, exported by OTLP/HTTP (gateway/tracing.py). Off: no cost."""

    enabled: bool = False
    otlp_endpoint: str = Field("http://127.0.0.1:4318/v1/traces", pattern=r"^https?://",
                               description="an OTLP/HTTP traces endpoint (a collector's /v1/traces)")
    service_name: str = Field("lifeline-gateway", min_length=1)
    sample_ratio: float = Field(1.0, ge=0.0, le=1.0, description="of traces the gateway starts; a client's own "
                                                                 "sampled flag is followed")
    export_interval: Seconds = Field(timedelta(seconds=2), gt=timedelta(0))
    export_timeout: Seconds = Field(timedelta(seconds=5), gt=timedelta(0))


class SessionsConfig(_Section):
    """Sessions and their KV checkpoints (gateway/sessions.py)."""

    default_class: str = Field("default", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
                               description="the session class of a session that names none (X-Session-Class)")
    store: str | None = Field(None, description="where the region's replicas keep session records: a KV store URL "
                                                "(redis://…, s3://…, a directory); unset: this process only")
    s3_endpoint_url: str | None = None
    checkpoint_timeout: Seconds = Field(timedelta(seconds=30), description="an engine's checkpointing completion (contract.session.checkpoint_completion)")
    policies: list[ReplicationPolicyEntry] = Field(default_factory=list, description="routing.source static only: "
                                                   "the replication policies a snapshot would carry")

    @field_validator("store")
    @classmethod
    def _store(cls, value: str | None) -> str | None:
        return None if value is None else check_kv_store_url(value)


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LIFELINE_GATEWAY_", env_nested_delimiter="__", extra="forbid")

    replica_id: str = "gateway-0"
    region: str = "local"
    zone: str = "local-a"
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    log_level: str = "info"
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="larger request bodies get 413")
    tokenize_in_thread_chars: int = Field(16 * 1024, ge=0, description="prompts longer than this are tokenized off the event loop")
    models: list[ModelConfig] = Field(default_factory=list, description="at least one when routing.source is static")
    engines: list[EngineConfig] = Field(default_factory=list)
    registry: RegistryConfig = Field(default_factory=RegistryConfig)
    token_log: TokenLogConfig = Field(default_factory=TokenLogConfig)
    recovery: RecoveryConfig = Field(default_factory=RecoveryConfig)
    outlier: OutlierConfig = Field(default_factory=OutlierConfig)
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    sessions: SessionsConfig = Field(default_factory=SessionsConfig)
    tracing: TracingConfig = Field(default_factory=TracingConfig)

    @property
    def routing_region(self) -> str:
        return self.routing.region or self.region

    @field_validator("models")
    @classmethod
    def _unique_aliases(cls, models: list[ModelConfig]) -> list[ModelConfig]:
        seen: set[str] = set()
        for m in models:
            if m.alias in seen:
                raise ValueError(f"models: alias {m.alias!r} listed twice")
            seen.add(m.alias)
        return models

    @model_validator(mode="after")
    def _one_region(self) -> GatewaySettings:
        # One region, named once: the lease registry and the verdict board are keyed by `region`, the snapshot is
        # read for `routing.region`. Two different values made a gateway that applied the snapshot, said it was
        # ready and routed nothing (no lease under the snapshot's region), without a word.
        if self.routing.region is not None and self.routing.region != self.region:
            raise ValueError(f"routing.region ({self.routing.region!r}) and region ({self.region!r}) disagree: "
                             "set region (LIFELINE_GATEWAY_REGION) alone, or both to the same value")
        return self

    @model_validator(mode="after")
    def _engines_name_known_versions(self) -> GatewaySettings:
        if self.routing.source == "static" and not self.models:
            raise ValueError("models: at least one model is required when routing.source is static")
        versions = {m.version for m in self.models}
        for e in self.engines:
            if e.version not in versions:
                raise ValueError(f"engines[{e.instance_id}].version {e.version!r} is not a version in models")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The environment beats the file, so one YAML serves every replica.
        return env_settings, init_settings

    @classmethod
    def load(cls, path: Path | None = None, **overrides: Any) -> GatewaySettings:
        values: dict[str, Any] = {}
        if path is not None:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
            if not isinstance(loaded, dict):
                raise ValueError(f"{path}: the top level must be a mapping")
            values.update(loaded)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
