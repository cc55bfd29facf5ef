"""The regional agent's settings: YAML or `LIFELINE_AGENT_*` environment, flags on top; durations in seconds."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from common.durations import Seconds


class ExternalEngine(BaseModel):
    """An engine whose lease the agent holds (stock vLLM). Missing fields come from /healthz/generation."""

    model_config = ConfigDict(extra="forbid")

    url: str
    instance_id: str | None = None
    version: str | None = None
    zone: str | None = None


def _engines(value: Any) -> Any:
    if isinstance(value, str):
        value = [u for u in value.split(",") if u.strip()]
    if isinstance(value, list):
        return [{"url": v.strip()} if isinstance(v, str) else v for v in value]
    return value


class ZoneTarget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    serving: int = Field(ge=0)
    warm: int = Field(ge=0)


class PoolSettings(BaseModel):
    """The warm pool the agent keeps: per zone the plan's serving and warm counts of one model."""

    model_config = ConfigDict(extra="forbid")

    driver: Literal["local"] = "local"
    model: str = Field(description="the snapshot's model name; its alias picks the version")
    alias: str = "prod"
    versions: dict[str, Path] = Field(min_length=1, description="version → model directory (local driver)")
    default_version: str | None = Field(None, description="used until a snapshot names the alias' version")
    zones: dict[str, ZoneTarget] = Field(min_length=1)
    state_dir: Path = Field(description="where instances keep their logs and state")
    engine_args: list[str] = Field(default_factory=list, description="extra `lifeline engine serve` flags")
    start_timeout: Seconds = Field(timedelta(seconds=180), gt=timedelta(0))

    @model_validator(mode="after")
    def _default_is_known(self) -> PoolSettings:
        if self.default_version is not None and self.default_version not in self.versions:
            raise ValueError(f"pool.default_version {self.default_version!r} is not in pool.versions")
        return self

    def fallback_version(self) -> str:
        return self.default_version or next(iter(self.versions))


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LIFELINE_AGENT_", extra="forbid")

    region: str = Field(min_length=1)
    agent_id: str | None = Field(None, max_length=160, description="names this agent in its reports; "
                                 "default host:pid")
    controlplane_url: str | None = Field(None, description="the control plane: snapshot in, events out")
    controlplane_token: str | None = None
    snapshot_cache: Path | None = Field(None, description="the last good snapshot on disk")
    snapshot_poll_interval: Seconds = Field(timedelta(seconds=1), gt=timedelta(0))
    report_interval: Seconds = Field(timedelta(seconds=1), gt=timedelta(0),
                                     description="between reports to PUT /api/v1/agents/{region}")
    registry: str = Field("redis://127.0.0.1:6379/0", description="the region's Redis lease registry")
    registry_prefix: str = "lifeline"
    lease_ttl: Seconds = Field(timedelta(seconds=2), gt=timedelta(0))
    probe_interval: Seconds = Field(timedelta(seconds=0.5), gt=timedelta(0),
                                    description="between health probes (and lease renewals); < lease_ttl")
    probe_timeout: Seconds = Field(timedelta(seconds=2), gt=timedelta(0))
    canary_per_instance_per_s: float = Field(0.1, gt=0, description="inference probe budget per instance")
    canary_jitter: float = Field(0.2, ge=0, lt=1)
    renew_leases_for: Annotated[list[ExternalEngine], BeforeValidator(_engines)] = Field(default_factory=list)
    canary_file: Path | None = Field(None, description="JSON: weight version → contract.canary.CanaryRecord")
    pool: PoolSettings | None = None
    port: int = Field(0, ge=0, le=65535, description="Prometheus metrics port; 0 serves none")
    log_level: str = "info"

    @model_validator(mode="after")
    def _renew_before_expiry(self) -> AgentSettings:
        if self.probe_interval >= self.lease_ttl:
            raise ValueError(f"probe_interval ({self.probe_interval.total_seconds()} s) must be shorter than "
                             f"lease_ttl ({self.lease_ttl.total_seconds()} s): leases are renewed per probe")
        return self
