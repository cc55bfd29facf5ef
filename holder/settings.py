"""Holder configuration: flags override `LIFELINE_HOLDER_*` environment variables; defaults live here."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from common.durations import Seconds
from contract.holder import normalize_device


class HolderSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LIFELINE_HOLDER_", extra="forbid")

    model: Path = Field(description="model directory (from `lifeline model build`) whose weights to hold")
    state_dir: Path = Field(description="where the ledger lives; keep it on a disk that survives the holder")
    shm_dir: Path | None = Field(None, description="where region files live (a tmpfs); default /dev/shm/lifeline-holder-<hash of state dir>")
    host: str = "127.0.0.1"
    port: int = Field(8100, ge=0, le=65535)
    dtype: Literal["float64", "float32"] = Field("float64", description="hold weights in the engines' compute dtype")
    lease_ttl: Seconds = Field(timedelta(seconds=2.5), description="a tenant silent this long is dead; its blocks freeze")
    heartbeat_interval: Seconds = Field(timedelta(seconds=1), description="how often tenants are told to renew")
    kv_blocks: int = Field(0, ge=0, description="KV blocks in the pool (0: hold weights only)")
    kv_block_tokens: int = Field(16, ge=1, description="token positions per KV block")
    device: str = Field("cpu", description="cpu, or cuda[:N]: also hold the weights on that device and export "
                        "them to tenants through CUDA IPC")
    log_level: str = "info"

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        return normalize_device(value)

    @model_validator(mode="after")
    def _check(self) -> HolderSettings:
        # The seed's band: detect a dead tenant within 1-3 s, and never from a single late heartbeat.
        if not timedelta(seconds=1) <= self.lease_ttl <= timedelta(seconds=3):
            raise ValueError("lease_ttl must be within [1, 3] seconds")
        if self.heartbeat_interval * 2 > self.lease_ttl:
            raise ValueError("heartbeat_interval must be at most half of lease_ttl (two heartbeats per lease)")
        return self

    def resolved_shm_dir(self) -> Path:
        if self.shm_dir is not None:
            return self.shm_dir
        tag = hashlib.sha256(str(self.state_dir.resolve()).encode()).hexdigest()[:12]
        return Path("/dev/shm") / f"lifeline-holder-{tag}"
