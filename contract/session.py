"""Sessions: what a gateway records of a multi-turn conversation, and when its KV is checkpointed.

A client names a session with `X-Session-Id` (or `user` with `X-Conversation-Id`)
and its class with `X-Session-Class`; the replication policy of (model, session
class) comes from the control plane's snapshot (`contract.snapshot.
ReplicationPolicyEntry`) and decides, per `checkpoint_due`, after which turns
the gateway asks the engine that served the turn to write the session's KV to
the region's store:

    rebuildable   never (system prompts, short contexts: a re-prefill is cheap)
    interactive   once `every_turns` turns or `every_seconds` seconds passed since the last checkpoint
    critical      after every turn

Records that cross a process boundary, defined once here:

- `SessionRecord`, kept by every gateway replica of a region in one shared store
  (`SessionStore` over a `contract.kv_checkpoint.KVStore`, key
  `sessions/<sha256 of model and id>.json`), so a turn served by another replica
  counts the same turns and checkpoints. The control plane's replication copies
  it to the standby region's store with the session's KV (`controlplane/
  replication/session_records.py`); a copy carries `replicated_at`, so the
  standby's gateway counts its next turn as served `elsewhere`. Both sides
  read a record with `parse_session_record`: an oversized, malformed or
  misplaced one is `SessionRecordInvalid`, never used;
- `KVCheckpointRequest` / `KVCheckpointWritten`, the body and answer of the
  engine's `POST /admin/kv/checkpoint`: the KV comes from the engine that holds
  it (computing any block it lacks) and goes to the store the engine was started
  with, blocks first, then the manifest (`contract.kv_checkpoint`).

Promise: cheaper semantic recovery, and a measured RPO_context. A checkpoint
never changes which tokens a turn produces; it decides how much of the context
a survivor re-prefills. What a turn re-prefilled of its context is
`context_recomputed_tokens`: the context (the prompt up to the end of the last
answer) minus what the engine restored from its prefix cache or the checkpoint
store (vLLM's `usage.prompt_tokens_details.cached_tokens`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from contract.kv_checkpoint import KVCheckpointInvalid, KVStore
from contract.snapshot import ReplicationPolicyEntry

SESSION_HEADER = "x-session-id"
CONVERSATION_HEADER = "x-conversation-id"
SESSION_CLASS_HEADER = "x-session-class"
MAX_SESSION_ID = 256
MAX_SESSION_RECORD_BYTES = 64 * 1024  # a record is well under 1 KiB; anything this large is not one
SESSION_KEY_PREFIX = "sessions/"
SESSION_USAGE_KEY = "lifeline_session"  # a usage frame's turn figures in the token log; clients see `lifeline.session`


class SessionRecord(BaseModel):
    """One session as its region's gateways know it; replaced whole after each turn."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    session_id: str = Field(min_length=1, max_length=MAX_SESSION_ID)
    model: str
    session_class: str
    turns: int = Field(0, ge=0, description="turns served")
    started_at: float = Field(description="Unix seconds of the first turn")
    context_tokens: int = Field(0, ge=0, description="what the next turn's prompt starts with, in tokens")
    context_digest: str | None = Field(None, description="sha256 of those token ids (`context_digest`)")
    checkpointed_turn: int = Field(0, ge=0, description="the turn the newest checkpoint covers (0: none)")
    checkpointed_tokens: int = Field(0, ge=0, description="context positions the newest checkpoint holds")
    checkpointed_at: float | None = None
    checkpoint_key: str | None = Field(None, description="the newest checkpoint's manifest key in the region's store")
    policy_revision: int | None = None
    recorded_at: float | None = Field(None, description="Unix seconds this turn was recorded (replication's lag)")
    replicated_at: float | None = Field(None, description="set by replication on a copy in another region's "
                                                          "store; None: written by this region's gateways")

    @property
    def version(self) -> tuple[int, float]:
        """Which of two records of one session is newer: turns first, then when it was recorded."""
        return self.turns, self.recorded_at if self.recorded_at is not None else 0.0

    def without_checkpoint(self) -> SessionRecord:
        """The record claiming no checkpoint: what a store that lacks the checkpoint may hold."""
        return self.model_copy(update={"checkpointed_turn": 0, "checkpointed_tokens": 0, "checkpointed_at": None,
                                       "checkpoint_key": None})


class SessionRecordInvalid(KVCheckpointInvalid):
    """A stored session record that is not one (`reason`: oversized, malformed, misplaced): never used."""

    def __init__(self, key: str, reason: str, detail: str) -> None:
        super().__init__(f"session record {key}: {detail}")
        self.key = key
        self.reason = reason


class KVCheckpointRequest(BaseModel):
    """`POST /admin/kv/checkpoint`: write the KV of this prefix (full blocks) to the engine's store."""

    model_config = ConfigDict(extra="forbid")

    token_ids: list[int] = Field(min_length=1, max_length=1 << 17)
    request_id: str | None = Field(None, max_length=300, description="provenance in the manifest (a session)")
    session_class: str | None = Field(None, min_length=1, max_length=200,
                                      description="the session's class, kept in the manifest: replication copies "
                                                  "the checkpoint only for that class's policy")


CHECKPOINT_PARAM = "lifeline_checkpoint"  # the key in a completion's kv_transfer_params (vLLM's per-request field)


class KVCheckpointAsk(BaseModel):
    """`kv_transfer_params.lifeline_checkpoint` of a completion: checkpoint what it computed, say who asked."""

    model_config = ConfigDict(extra="forbid")

    request_id: str | None = Field(None, max_length=300, description="provenance in the manifest (a session)")
    session_class: str | None = Field(None, min_length=1, max_length=200)


def checkpoint_completion(model: str, request: KVCheckpointRequest) -> dict:
    """The one request that checkpoints a prefix on either engine kind: a one-token completion of it, whose
    `kv_transfer_params` ask for the full blocks of its prompt (vLLM through `lifeline_vllm.kv_connector`, the
    reference engine itself); the answer's `kv_transfer_params` carry `KVCheckpointWritten`."""
    ask = KVCheckpointAsk(request_id=request.request_id, session_class=request.session_class)
    return {"model": model, "prompt": request.token_ids, "max_tokens": 1, "temperature": 0.0, "stream": False,
            "kv_transfer_params": {CHECKPOINT_PARAM: ask.model_dump(exclude_none=True)}}


def checkpoint_written(answer: dict) -> KVCheckpointWritten | None:
    """What a checkpointing completion's answer says was checkpointed; None: the engine did not checkpoint
    (a vLLM without the connector ignores the field)."""
    params = (answer.get("kv_transfer_params") or {}).get(CHECKPOINT_PARAM)
    return None if params is None else KVCheckpointWritten.model_validate(params)


class KVCheckpointWritten(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    root_hash: str
    last_hash: str
    key: str = Field(description="the manifest's key in the engine's store")
    blocks: int
    tokens: int = Field(description="positions the checkpoint holds: whole blocks of the prefix")
    computed_tokens: int = Field(description="positions the engine prefilled for it (not in its prefix cache)")
    written: bool = Field(True, description="in the store when answered; false: copied out, being written (vLLM)")


def checkpoint_due(policy: ReplicationPolicyEntry | None, record: SessionRecord, *, now: float) -> bool:
    """Pure: whether the turn just recorded (`record.turns`) is one of the policy's key points."""
    if policy is None or policy.mode == "rebuildable" or record.turns <= record.checkpointed_turn:
        return False
    if policy.mode == "critical":
        return True
    if policy.every_turns is not None and record.turns - record.checkpointed_turn >= policy.every_turns:
        return True
    since = record.checkpointed_at if record.checkpointed_at is not None else record.started_at
    return policy.every_seconds is not None and now - since >= policy.every_seconds


def context_digest(token_ids: Sequence[int]) -> str:
    return hashlib.sha256(",".join(map(str, token_ids)).encode()).hexdigest()


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading token ids `a` and `b` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def session_key(model: str, session_id: str) -> str:
    digest = hashlib.sha256(f"{model}\0{session_id}".encode()).hexdigest()
    return f"{SESSION_KEY_PREFIX}{digest}.json"


def parse_session_record(data: bytes, *, key: str) -> SessionRecord:
    """The record stored under `key`; SessionRecordInvalid if it is too large, does not parse, or names
    another session than its key (a record copied or written under the wrong name)."""
    if len(data) > MAX_SESSION_RECORD_BYTES:
        raise SessionRecordInvalid(key, "oversized", f"{len(data)} bytes, more than {MAX_SESSION_RECORD_BYTES}")
    try:
        record = SessionRecord.model_validate_json(data)
    except ValueError:
        raise SessionRecordInvalid(key, "malformed", "does not parse as a session record") from None
    if session_key(record.model, record.session_id) != key:
        raise SessionRecordInvalid(key, "misplaced", "names another session than its key")
    return record


class SessionStore:
    """Session records over any KVStore (a directory, Redis, S3, or memory). Blocking: call from a thread."""

    def __init__(self, store: KVStore) -> None:
        self.store = store

    def get(self, model: str, session_id: str) -> SessionRecord | None:
        """The session's record, None if there is none; SessionRecordInvalid if what is stored is not one."""
        key = session_key(model, session_id)
        data = self.store.get(key)
        return None if data is None else parse_session_record(data, key=key)

    def put(self, record: SessionRecord) -> None:
        self.store.put(session_key(record.model, record.session_id), record.model_dump_json().encode())
