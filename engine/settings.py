"""Engine configuration: flags override `LIFELINE_ENGINE_*` environment variables.

Every default is written here and only here: the CLI (`engine/cli.py`) passes
the flags a user actually gave, so pydantic-settings' order (init arguments,
then the environment, then these defaults) is the documented one.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from common.durations import Seconds
from contract.kv_checkpoint import check_kv_store_url


class FaultSettings(BaseSettings):
    """Faults to inject. All off by default; the admin endpoint can change them at run time."""

    model_config = SettingsConfigDict(env_prefix="LIFELINE_ENGINE_FAULT_")

    exit_after_tokens: int | None = Field(None, ge=0, description="os._exit after this many tokens sent")
    hang_after_tokens: int | None = Field(None, ge=0, description="stop sending after this many tokens")
    stall_step_after_tokens: int | None = Field(
        None, ge=0, description="block the decode loop inside a step once this many tokens were sent "
                                "(every stream stops; cleared by POST /admin/faults)")
    token_delay_ms: float = Field(0.0, ge=0, description="delay every token")
    first_token_delay_ms: float = Field(0.0, ge=0, description="delay the first token")
    fail_next_requests: int = Field(0, ge=0, description="answer the next K requests with HTTP 500")
    corrupt_weights: bool = Field(False, description="corrupt weights in memory after load")


class EngineSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LIFELINE_ENGINE_", extra="forbid")

    model: Path = Field(description="model directory (from `lifeline model build`)")
    served_model_name: str | None = Field(None, description="name clients use; defaults to the directory name")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    instance_id: str = "engine-0"
    zone: str = "local-a"
    region: str = "local"
    state_dir: Path | None = Field(None, description="where the boot generation counter lives")
    dtype: Literal["float64", "float32"] = Field("float64", description="float64 (exact resume) or float32 (faster)")
    max_num_seqs: int = Field(64, ge=1, description="sequences decoded together; more wait")
    max_waiting: int = Field(256, ge=0, description="sequences waiting for a decode slot; more are refused at once "
                             "(429 engine_overloaded, Retry-After) instead of queued without bound")
    max_prefill_tokens: int = Field(2048, ge=1, description="prompt tokens prefilled per scheduler step (at least one prompt)")
    torch_threads: int | None = Field(None, ge=1)
    enable_fault_admin: bool = Field(False, description="expose GET/POST /admin/faults")
    log_level: str = "info"
    registry: str | None = Field(None, description="lease registry: the gateway's URL or redis://…?key_prefix=…")
    registry_token: str | None = Field(None, description="bearer token for the gateway's lease endpoint")
    advertise_url: str | None = Field(None, description="URL the gateway should use to reach us")
    holder: str | None = Field(None, description="memory holder URL (`lifeline holder serve`): map its weights "
                                                 "instead of loading; falls back to disk when it cannot")
    kv_block_tokens: int = Field(16, ge=1, le=1024, description="positions per KV block of the in-process prefix "
                                 "cache (a holder's KV pool sets its own)")
    kv_cache_blocks: int = Field(512, ge=0, description="KV blocks the in-process prefix cache keeps, least recently "
                                 "used evicted first (0: no prefix cache without a holder)")
    kv_checkpoint_store: str | None = Field(
        None, description="regional KV checkpoint store: a directory, file://…, redis://…?key_prefix=… or "
                          "s3://bucket/prefix; continuations import from it instead of prefilling")
    kv_checkpoint_s3_endpoint_url: str | None = Field(None, description="S3 endpoint for an s3:// checkpoint store")
    kv_checkpoint_every: int = Field(64, ge=1, description="checkpoint a running sequence every this many "
                                     "generated tokens (full blocks only)")
    enable_kv_admin: bool = Field(False, description="expose GET /admin/kv, POST /admin/kv/export and /admin/kv/import")
    kv_import_max_bytes: int = Field(256 << 20, ge=1, description="largest KV bundle POST /admin/kv/import accepts")
    # Above the longest healthy step: a full 2048-token prefill of the tiny preset took 7.9 s on a loaded 2-core
    # CPU. A bound under that fails liveness on a healthy engine (ejected, restarted), worse than a late verdict.
    step_stall_bound: Seconds = Field(
        timedelta(seconds=10), gt=timedelta(0),
        description="/healthz/live answers 503 once one decode step has run longer than this many seconds")
    drain_unroute_wait: Seconds = Field(
        timedelta(seconds=1), ge=timedelta(0),
        description="on SIGTERM, after releasing the lease: seconds to keep refusing (503) so gateways stop routing here")
    drain_timeout: Seconds = Field(
        timedelta(seconds=30), ge=timedelta(0),
        description="then seconds in-flight requests may finish before they end with an engine_draining error")

    @field_validator("kv_checkpoint_store")
    @classmethod
    def _a_store_url(cls, value: str | None) -> str | None:
        return None if value is None else check_kv_store_url(value)

    @model_validator(mode="after")
    def _checkpoints_need_a_cache(self) -> EngineSettings:
        if self.kv_checkpoint_store and self.kv_cache_blocks == 0 and not self.holder:
            raise ValueError("kv_checkpoint_store needs a prefix cache to import into: kv_cache_blocks > 0 or a holder")
        return self

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model.name

    def resolved_state_dir(self) -> Path:
        if self.state_dir is not None:
            return self.state_dir
        return Path.home() / ".local" / "state" / "lifeline" / "engine" / self.instance_id
