"""Engine configuration: flags override `LIFELINE_ENGINE_*` environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class FaultSettings(BaseSettings):
    """Faults to inject. All off by default; the admin endpoint can change them at run time."""

    model_config = SettingsConfigDict(env_prefix="LIFELINE_ENGINE_FAULT_")

    exit_after_tokens: int | None = Field(None, ge=0, description="os._exit after this many tokens sent")
    hang_after_tokens: int | None = Field(None, ge=0, description="stop sending after this many tokens")
    token_delay_ms: float = Field(0.0, ge=0)
    first_token_delay_ms: float = Field(0.0, ge=0)
    fail_next_requests: int = Field(0, ge=0, description="answer the next K requests with HTTP 500")
    corrupt_weights: bool = False


class EngineSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LIFELINE_ENGINE_")

    model: Path
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    instance_id: str = "engine-0"
    zone: str = "local-a"
    region: str = "local"
    state_dir: Path | None = None
    dtype: Literal["float64", "float32"] = "float64"
    max_num_seqs: int = Field(64, ge=1, description="sequences decoded together; more wait")
    max_prefill_tokens: int = Field(2048, ge=1, description="prompt tokens prefilled per scheduler step (at least one prompt)")
    torch_threads: int | None = Field(None, ge=1)
    enable_fault_admin: bool = False
    log_level: str = "info"
    registry: str | None = Field(None, description="lease registry URL (gateway or redis://)")
    registry_token: str | None = None
    advertise_url: str | None = Field(None, description="URL the gateway should use to reach us")

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model.name

    def resolved_state_dir(self) -> Path:
        if self.state_dir is not None:
            return self.state_dir
        return Path.home() / ".local" / "state" / "lifeline" / "engine" / self.instance_id
