"""Replication request and response shapes. Store URLs are checked by contract.kv_checkpoint and
answered back redacted (`redact_kv_store_url`): a password sent in a Redis URL is never echoed."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from contract.kv_checkpoint import check_kv_store_url, redact_kv_store_url
from controlplane.replication.states import DeadLetterState
from controlplane.types import Name, Reason

SESSION_CLASS_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
MAX_SECONDS = 10 * 365 * 86400  # bounded so it fits an integer column on both databases
DEFAULT_MAX_ATTEMPTS = 5


def _check_store_parts(url: str) -> None:
    """What `check_kv_store_url` leaves to connection time, refused now: a worker would fail on it at
    every sweep. A port that is not one, a Redis database that is not a number, a file URL with no path."""
    parts = urlsplit(url)
    if parts.scheme:
        parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    if parts.scheme in ("redis", "rediss") and parts.path.strip("/") and not parts.path.strip("/").isdigit():
        raise ValueError(f"{url!r}: the Redis database must be a number (redis://host:port/0)")
    if parts.scheme == "file" and not parts.path.strip("/"):
        raise ValueError(f"{url!r}: name a directory (file:///path)")


class ReplicationMode(StrEnum):
    """How much KV a session class keeps across a region loss: replication is chosen per session class."""

    REBUILDABLE = "rebuildable"  # no KV replication: system prompts, short contexts; re-prefill is cheap
    INTERACTIVE = "interactive"  # a checkpoint every N turns or T seconds; replicated every T seconds
    CRITICAL = "critical"  # every turn / every checkpoint; replicated at every sweep


class ReplicationPolicySpec(BaseModel):
    """`PUT /api/v1/replication/policies`: set one policy (created if new)."""

    model_config = ConfigDict(extra="forbid")

    model: Name
    session_class: str = Field(pattern=SESSION_CLASS_PATTERN)
    mode: ReplicationMode
    every_turns: int | None = Field(None, ge=1, le=10_000, description="interactive: checkpoint every N turns")
    every_seconds: int | None = Field(None, ge=1, le=MAX_SECONDS,
                                      description="interactive: checkpoint (and replicate) every T seconds")
    rpo_context_seconds: int = Field(ge=0, le=MAX_SECONDS, description="declared RPO_context target")
    rpo_context_turns: int | None = Field(None, ge=0, le=10_000)
    source_store: str | None = Field(None, max_length=2000, description="the primary region's KV store")
    destination_store: str | None = Field(None, max_length=2000, description="the standby region's KV store")
    retention_seconds: int = Field(86400, ge=60, le=MAX_SECONDS,
                                   description="checkpoints older than this are deleted at the destination")
    max_attempts: int = Field(DEFAULT_MAX_ATTEMPTS, ge=1, le=50, description="copies tried before a dead letter")
    reason: Reason
    expected_revision: int | None = Field(None, ge=0, le=2**31 - 1, description="compare-and-set; 0: must be new")

    @field_validator("source_store", "destination_store")
    @classmethod
    def _store(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if "\x00" in value:
            raise ValueError("must not contain NUL bytes")
        value = value.strip()
        try:
            check_kv_store_url(value)
            _check_store_parts(value)
        except ValueError as exc:  # the message names the URL: say what is wrong without echoing a password
            raise ValueError(str(exc).replace(value, redact_kv_store_url(value))) from None
        return value

    @model_validator(mode="after")
    def _mode_fits(self) -> ReplicationPolicySpec:
        if self.mode == ReplicationMode.INTERACTIVE and self.every_turns is None and self.every_seconds is None:
            raise ValueError("an interactive policy needs every_turns or every_seconds")
        if self.mode != ReplicationMode.INTERACTIVE and (self.every_turns or self.every_seconds):
            raise ValueError(f"every_turns and every_seconds belong to interactive policies, not {self.mode}")
        if self.mode != ReplicationMode.REBUILDABLE:
            if not self.source_store or not self.destination_store:
                raise ValueError(f"a {self.mode} policy needs a source_store and a destination_store")
            if self.source_store == self.destination_store:
                raise ValueError("source_store and destination_store must differ")
        return self


class ReplicationPolicyRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    model: str
    session_class: str
    mode: ReplicationMode
    every_turns: int | None
    every_seconds: int | None
    rpo_context_seconds: int
    rpo_context_turns: int | None
    source_store: str | None
    destination_store: str | None
    retention_seconds: int
    max_attempts: int
    revision: int
    reason: str
    updated_by: str
    created_at: datetime
    updated_at: datetime

    @field_validator("source_store", "destination_store", mode="before")
    @classmethod
    def _redacted(cls, value: Any) -> Any:
        return redact_kv_store_url(value) if value else None


class DeadLetterRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    checkpoint_key: str
    attempts: int
    error: str
    created_at: datetime
    state: DeadLetterState
    state_changed_at: datetime | None = None
    state_changed_by: str | None = None


class PolicyDeadLetters(BaseModel):
    """`GET /api/v1/replication/dead-letters`: one policy's dead letters."""

    model: str
    session_class: str
    dead_letters: list[DeadLetterRead]


CheckpointKey = Annotated[str, StringConstraints(min_length=1, max_length=300, pattern=r"^[^\x00]*$")]


class DeadLetterSelection(BaseModel):
    """`POST /api/v1/replication/dead-letters/retry|clear`: which of one policy's dead letters.

    `checkpoint_keys` omitted: every letter in the `dead` state. Named keys are all or nothing: one that
    is not a dead letter of the policy refuses the whole request (404) and changes nothing.
    """

    model_config = ConfigDict(extra="forbid")

    model: Name
    session_class: str = Field(pattern=SESSION_CLASS_PATTERN)
    checkpoint_keys: list[CheckpointKey] | None = Field(None, min_length=1, max_length=1000)
    reason: Reason


class DeadLetterActionRead(BaseModel):
    """What a retry or clear did: `changed` moved to `state`, `unchanged` were in it already (a no-op)."""

    model: str
    session_class: str
    action: str
    state: DeadLetterState
    changed: list[str]
    unchanged: list[str]


class ReplicationClassStatus(BaseModel):
    """One policy's replication as of now: lag is computed at read time from the last sweep's oldest pending."""

    model: str
    session_class: str
    mode: ReplicationMode
    revision: int
    rpo_context_seconds: int
    last_sweep_at: datetime | None
    pending: int
    lag_seconds: float | None = Field(description="pending: now - the oldest pending checkpoint's creation; "
                                                  "else the last replicated checkpoint's lag")
    within_rpo: bool | None
    replicated_total: int
    blocks_copied_total: int
    deleted_total: int
    last_replicated_at: datetime | None
    last_lag_seconds: float | None
    last_error: str | None
    dead_letters: list[DeadLetterRead]


class ReplicationStatusRead(BaseModel):
    policies: list[ReplicationClassStatus]
