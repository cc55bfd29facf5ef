"""Gateway configuration: a YAML file, overridden by `LIFELINE_GATEWAY_*` variables.

Nested keys use `__` in the environment (`LIFELINE_GATEWAY_RECOVERY__STALL_TIMEOUT=1.5`).
Durations are `timedelta`; YAML and the environment give them in seconds.
A missing or bad value stops start-up with a message naming the key.
"""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict


def _seconds(value: Any) -> Any:
    """Environment variables arrive as strings: read "1.5" as seconds, as YAML numbers are."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


Seconds = Annotated[timedelta, BeforeValidator(_seconds)]


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


class RegistryConfig(_Section):
    kind: Literal["memory", "redis"] = "memory"
    url: str | None = Field(None, description="redis://… when kind is redis")
    key_prefix: str = Field("lifeline", description="keys are {key_prefix}:{region}:… (contract.lease)")
    token: str | None = Field(None, description="bearer token engines present to the lease endpoint")
    ttl: Seconds = Field(timedelta(seconds=2), description="lease time to live; engines renew before it lapses")
    require_lease: bool = Field(True, description="static engines need a live lease to be routed to")
    refresh_interval: Seconds = Field(timedelta(milliseconds=250), description="how often a Redis view is re-read")

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

    @model_validator(mode="after")
    def _check(self) -> TokenLogConfig:
        if self.kind == "redis" and not self.url:
            raise ValueError("token_log.url is required when token_log.kind is redis")
        return self


class RecoveryConfig(_Section):
    strategy: RecoveryStrategy = RecoveryStrategy.TOKEN_COMMIT_RESUME
    max_migrations: int = Field(3, ge=0)
    connect_timeout: Seconds = timedelta(seconds=1)
    first_token_timeout: Seconds = Field(timedelta(seconds=30), description="prefill budget before a stall is declared")
    stall_timeout: Seconds = Field(timedelta(seconds=2), description="no token for this long mid-stream: migrate")
    request_timeout: Seconds = Field(timedelta(minutes=5), description="default deadline; X-Lifeline-Timeout-Ms overrides")
    min_deadline_remaining: Seconds = Field(timedelta(milliseconds=500), description="do not migrate with less left")
    suppress_for: Seconds = Field(timedelta(seconds=10), description="a failed endpoint is skipped locally this long")


class AdmissionConfig(_Section):
    max_concurrency_per_engine: int = Field(8, ge=1)
    max_queue: int = Field(16, ge=0, description="requests waiting for an engine slot; more get 429")
    queue_timeout: Seconds = timedelta(seconds=5)
    retry_after: Seconds = timedelta(seconds=1)
    retry_budget_ratio: float = Field(0.2, ge=0.0, le=1.0, description="migrations in flight ≤ this × active requests")
    retry_budget_min: int = Field(3, ge=0, description="migrations always allowed in flight, as Envoy's min_retry_concurrency")
    hash_load_factor: float = Field(1.25, ge=1.0, description="bounded-load consistent hashing: c × mean load")


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LIFELINE_GATEWAY_", env_nested_delimiter="__", extra="forbid")

    replica_id: str = "gateway-0"
    region: str = "local"
    zone: str = "local-a"
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    log_level: str = "info"
    models: list[ModelConfig] = Field(min_length=1)
    engines: list[EngineConfig] = Field(default_factory=list)
    registry: RegistryConfig = Field(default_factory=RegistryConfig)
    token_log: TokenLogConfig = Field(default_factory=TokenLogConfig)
    recovery: RecoveryConfig = Field(default_factory=RecoveryConfig)
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)

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
    def _engines_name_known_versions(self) -> GatewaySettings:
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
