"""Gateway sessions: record each turn, checkpoint the session's KV at the policy's key points, and measure
how much context a turn re-prefilled (`contract.session` holds the records and the rule).

A request joins a session when it names one (`X-Session-Id`, or `user` with
`X-Conversation-Id`); `X-Session-Class` picks the replication policy (default
`sessions.default_class`). The policy comes from the snapshot the gateway
already holds (routing.source snapshot) or from this file's `sessions.policies`
(routing.source static); the control plane is never called on a request's path.

Per turn:

- *context*: what the prompt holds of earlier turns. For chat, the rendered
  conversation up to and including the last assistant message (so a standby
  gateway that never saw the session computes it from the request alone); for
  a completion, the previous turn's `prompt ‖ answer` when the session record
  says the prompt starts with it.
- *cached*: what the engine restored instead of prefilling, read from its first
  chunk (vLLM's `usage.prompt_tokens_details.cached_tokens`, asked for with
  `stream_options.continuous_usage_stats`).
- *context_recomputed_tokens* = context − cached (at least 0): the context the
  turn re-prefilled. After a region loss it is the RPO_context actually paid;
  it is on the response (`lifeline.session`), in the log (`session turn`) and
  in `lifeline_gateway_session_context_recomputed_tokens{continuity}`.
- *continuity*: `here` when a gateway of this region recorded the previous
  turn, `elsewhere` when the previous turn was served in another region — a
  failover: the record is a replica (`replicated_at`, copied with the
  session's KV by the control plane's replication), or there is none yet the
  prompt carries context (not replicated, or lost). With a replica the
  standby knows the session's turns and, for a completion, its context.
  Every turn re-prefills its context's last partial block, fault or not;
  summed over `continuity="elsewhere"` the histogram is what faults cost,
  not that ordinary remainder.

After the turn (in the background, never delaying the client's last event) the
record is updated and, when `checkpoint_due`, the engine that served the last
token is asked to checkpoint the next turn's context — for chat the context as
the client will send it back, re-rendered and re-tokenized, which may differ
from the ids the engine generated; the engine computes the blocks it lacks.
A failed checkpoint is logged and counted; the session continues (a miss,
never an error). Turns of one session on one replica are recorded in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from common.chat_template import render_chat
from common.clock import Clock
from common.logs import get_logger
from contract.kv_checkpoint import KVCheckpointError, KVStore, MemoryKVStore, open_kv_store
from contract.session import (
    CONVERSATION_HEADER,
    MAX_SESSION_ID,
    SESSION_CLASS_HEADER,
    SESSION_HEADER,
    KVCheckpointRequest,
    KVCheckpointWritten,
    SessionRecord,
    SessionStore,
    checkpoint_completion,
    checkpoint_due,
    checkpoint_written,
    common_prefix,
    context_digest,
)
from contract.snapshot import ReplicationPolicyEntry
from gateway.errors import BadRequest
from gateway.metrics import GatewayMetrics
from gateway.routing_table import ModelVersion, RoutingTable
from gateway.schemas import ChatCompletionRequest, GatewaySampling
from gateway.settings import SessionsConfig
from gateway.snapshot_table import SnapshotRouting

log = get_logger(__name__)
SESSION_CLASS_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def render_history(template: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
    """The conversation as the chat template renders it, without a generation prompt: what a later turn
    starts with (the same tools offered: they open the prompt)."""
    return render_chat(template, messages, tools=tools, add_generation_prompt=False)


@dataclass
class SessionTurn:
    """One turn of a session while it is served; `figures()` is what the response and the log report."""

    session_id: str
    session_class: str
    model: str  # the policy's model name (the catalog model, or the static alias)
    policy: ReplicationPolicyEntry | None
    record: SessionRecord | None  # as it was before this turn
    context_tokens: int
    next_context: Callable[[list[int], str], list[int]]  # (answer ids, answer text) → the next turn's context
    cached_tokens: int | None = None  # from the engine's first chunk; None: the engine did not say

    @property
    def turn(self) -> int:
        return (self.record.turns if self.record else 0) + 1

    @property
    def continuity(self) -> str:
        if self.record is None:
            return "elsewhere" if self.context_tokens > 0 else "here"
        return "here" if self.record.replicated_at is None else "elsewhere"

    @property
    def context_recomputed_tokens(self) -> int | None:
        return None if self.cached_tokens is None else max(0, self.context_tokens - self.cached_tokens)

    def figures(self) -> dict[str, Any]:
        return {"id": self.session_id, "class": self.session_class, "turn": self.turn,
                "mode": self.policy.mode if self.policy else None, "context_tokens": self.context_tokens,
                "cached_tokens": self.cached_tokens, "context_recomputed_tokens": self.context_recomputed_tokens,
                "continuity": self.continuity}


def session_id_of(headers: Mapping[str, str], body: GatewaySampling) -> str | None:
    """`X-Session-Id`, else `user` + `X-Conversation-Id`; None: not a session. BadRequest if malformed."""
    named = headers.get(SESSION_HEADER)
    if named is None and (conversation := headers.get(CONVERSATION_HEADER)) is not None:
        if not body.user:
            raise BadRequest("X-Conversation-Id names a session together with `user`; set `user`", param="user")
        named = f"{body.user}/{conversation}"
    if named is None:
        return None
    if not 0 < len(named) <= MAX_SESSION_ID or not named.isprintable():
        raise BadRequest(f"a session id is 1-{MAX_SESSION_ID} printable characters", param="X-Session-Id")
    return named


class SessionKeeper:
    """Opens and finishes session turns for one gateway replica; one per process (`GatewayState.sessions`)."""

    def __init__(self, config: SessionsConfig, table: RoutingTable, metrics: GatewayMetrics, clock: Clock, *,
                 store: KVStore | None = None, http: httpx.AsyncClient | None = None) -> None:
        self.config = config
        self.table = table
        self.metrics = metrics
        self.clock = clock
        self.records = SessionStore(store or _open_store(config))
        timeout = config.checkpoint_timeout.total_seconds()
        self.http = http or httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=min(timeout, 2.0)))
        self._pending: dict[tuple[str, str], asyncio.Task[None]] = {}

    async def close(self) -> None:
        """Let the turns already answered be recorded (at most one checkpoint timeout), then stop."""
        pending = list(self._pending.values())
        if pending:
            _, late = await asyncio.wait(pending, timeout=self.config.checkpoint_timeout.total_seconds())
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        await self.http.aclose()

    def policy_for(self, version: ModelVersion, session_class: str) -> tuple[str, ReplicationPolicyEntry | None]:
        """(model, policy): from the applied snapshot, else from `sessions.policies` (static routing)."""
        if isinstance(self.table, SnapshotRouting):
            current = self.table.table
            model = current.model_of_version.get(version.version, version.alias)
            snapshot = current.snapshot
            return model, snapshot.replication_policy(model, session_class) if snapshot else None
        for policy in self.config.policies:
            if policy.model in (version.alias, version.version) and policy.session_class == session_class:
                return policy.model, policy
        return version.alias, None

    async def open(self, headers: Mapping[str, str], body: GatewaySampling, version: ModelVersion,
                   prompt_ids: list[int]) -> SessionTurn | None:
        """The turn this request is, or None when it names no session."""
        session_id = session_id_of(headers, body)
        if session_id is None:
            return None
        session_class = headers.get(SESSION_CLASS_HEADER) or self.config.default_class
        if not 0 < len(session_class) <= 64 or not set(session_class) <= SESSION_CLASS_CHARS:
            raise BadRequest("X-Session-Class is 1-64 letters, digits, '.', '_' or '-'", param="X-Session-Class")
        model, policy = self.policy_for(version, session_class)
        pending = self._pending.get((model, session_id))
        if pending is not None:  # the previous turn's record (and checkpoint) first: turns count in order
            await asyncio.wait((pending,))
        record = await self._get(model, session_id)
        if isinstance(body, ChatCompletionRequest) and version.chat_template is not None:
            context, next_context = self._chat_context(body, version, prompt_ids)
        else:
            context = _completion_context(record, prompt_ids)

            def next_context(answer_ids: list[int], _: str) -> list[int]:
                return [*prompt_ids, *answer_ids]
        return SessionTurn(session_id, session_class, model, policy, record, context, next_context)

    def _chat_context(self, body: ChatCompletionRequest, version: ModelVersion,
                      prompt_ids: list[int]) -> tuple[int, Callable[[list[int], str], list[int]]]:
        template = version.chat_template
        assert template is not None  # the caller checked
        messages = [m.template_dict() for m in body.messages]
        tools = body.offered_tools()
        last_answer = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
        context = 0
        if last_answer >= 0:
            history = version.tokenizer.encode(render_history(template, messages[:last_answer + 1], tools),
                                               add_special_tokens=False).ids
            context = common_prefix(prompt_ids, history)

        def next_context(_: list[int], answer_text: str) -> list[int]:
            rendered = render_history(template, [*messages, {"role": "assistant", "content": answer_text}], tools)
            return version.tokenizer.encode(rendered, add_special_tokens=False).ids

        return context, next_context

    def finish(self, turn: SessionTurn, *, engine_url: str, engine_model: str, answer_ids: list[int],
               answer_text: str) -> None:
        """The turn was answered: record it and checkpoint when due, in the background."""
        self.metrics.session_turns.labels(session_class=turn.session_class).inc()
        self.metrics.session_context_tokens.labels(session_class=turn.session_class).inc(turn.context_tokens)
        if turn.context_recomputed_tokens is not None:
            self.metrics.session_context_recomputed.labels(
                session_class=turn.session_class, continuity=turn.continuity).observe(turn.context_recomputed_tokens)
        log.info("session turn", **turn.figures(), policy_revision=turn.policy.revision if turn.policy else None)
        key = (turn.model, turn.session_id)
        task = asyncio.create_task(self._record(turn, engine_url, engine_model, answer_ids, answer_text),
                                   name=f"session-{turn.session_id}")
        self._pending[key] = task
        task.add_done_callback(lambda done: self._pending.pop(key, None) if self._pending.get(key) is done else None)

    async def _record(self, turn: SessionTurn, engine_url: str, engine_model: str, answer_ids: list[int],
                      answer_text: str) -> None:
        now = self.clock.wall()
        previous = turn.record
        context = turn.next_context(answer_ids, answer_text)
        record = SessionRecord(
            session_id=turn.session_id, model=turn.model, session_class=turn.session_class, turns=turn.turn,
            started_at=previous.started_at if previous else now, context_tokens=len(context),
            context_digest=context_digest(context),
            checkpointed_turn=previous.checkpointed_turn if previous else 0,
            checkpointed_tokens=previous.checkpointed_tokens if previous else 0,
            checkpointed_at=previous.checkpointed_at if previous else None,
            checkpoint_key=previous.checkpoint_key if previous else None,
            policy_revision=turn.policy.revision if turn.policy else None, recorded_at=now)
        if checkpoint_due(turn.policy, record, now=now):
            written = await self._checkpoint(turn, engine_url, engine_model, context)
            if written is not None:
                record = record.model_copy(update={"checkpointed_turn": record.turns, "checkpointed_tokens":
                                                   written.tokens, "checkpointed_at": now,
                                                   "checkpoint_key": written.key})
        try:
            await asyncio.to_thread(self.records.put, record)
        except KVCheckpointError as exc:
            log.warning("session record not stored", session_id=turn.session_id, error=str(exc))

    async def _checkpoint(self, turn: SessionTurn, engine_url: str, engine_model: str,
                          context: list[int]) -> KVCheckpointWritten | None:
        """The same request to either engine kind (`contract.session.checkpoint_completion`)."""
        body = KVCheckpointRequest(token_ids=context, request_id=f"session:{turn.session_id}#turn:{turn.turn}",
                                   session_class=turn.session_class)
        labels = {"session_class": turn.session_class}
        try:
            response = await self.http.post(f"{engine_url.rstrip('/')}/v1/completions",
                                            json=checkpoint_completion(engine_model, body))
            response.raise_for_status()
            written = checkpoint_written(response.json())
            if written is None:
                raise ValueError("the engine answered without checkpointing (a vLLM without Lifeline's KV connector)")
        except (httpx.HTTPError, ValueError) as exc:
            self.metrics.session_checkpoints.labels(**labels, outcome="failed").inc()
            log.warning("session checkpoint failed; the session continues without it", session_id=turn.session_id,
                        turn=turn.turn, engine=engine_url, error=f"{type(exc).__name__}: {exc}")
            return None
        self.metrics.session_checkpoints.labels(**labels, outcome="written").inc()
        self.metrics.session_checkpointed_tokens.labels(**labels).inc(written.tokens)
        log.info("session checkpointed", session_id=turn.session_id, turn=turn.turn, tokens=written.tokens,
                 computed_tokens=written.computed_tokens, key=written.key, engine=engine_url)
        return written

    async def _get(self, model: str, session_id: str) -> SessionRecord | None:
        try:
            return await asyncio.to_thread(self.records.get, model, session_id)
        except KVCheckpointError as exc:  # a record we cannot read is a session we start again
            log.warning("session record unreadable; starting from the request", session_id=session_id, error=str(exc))
            return None

    async def wait_recorded(self) -> None:
        """Until every turn finished so far is recorded (tests, shutdown)."""
        while self._pending:
            await asyncio.wait(list(self._pending.values()))


def _completion_context(record: SessionRecord | None, prompt_ids: list[int]) -> int:
    """The previous turn's context, if this prompt starts with it (the record holds its length and digest)."""
    if record is None or not record.context_tokens or record.context_tokens > len(prompt_ids):
        return 0
    return record.context_tokens if context_digest(prompt_ids[:record.context_tokens]) == record.context_digest else 0


def _open_store(config: SessionsConfig) -> KVStore:
    if config.store is None:
        return MemoryKVStore()
    return open_kv_store(config.store, s3_endpoint_url=config.s3_endpoint_url)

