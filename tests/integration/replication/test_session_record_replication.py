"""One contract, both sides: a session record written by region A's gateway (`SessionKeeper` over the real
store), replicated by the sweep, read by region B's gateway, on a directory and Redis, on virtual time.

Region A's engine answers the gateway's checkpointing completions (an httpx mock transport) writing real checkpoints to
A's store, as an engine does; the gateway's `sessions.store` is that same store, so the policy's sweep
finds the records beside the checkpoints. What holds:

- the record reaches B at the sweep, before its checkpoint: B's next turn knows the session's turns and
  context, counted `elsewhere`, and the copy claims no checkpoint B lacks;
- once the checkpoint is copied, the next sweep completes the claim; B reads A's record, plus
  `replicated_at`;
- the record's lag is in the status and, while pending, in the API's /metrics lag against RPO_context;
- oversized, malformed and misplaced records are skipped with their reason and counted; the sweep goes on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from contract.kv_checkpoint import KVCheckpointStore, open_kv_store
from contract.session import (
    CHECKPOINT_PARAM,
    MAX_SESSION_RECORD_BYTES,
    KVCheckpointWritten,
    SessionRecord,
    session_key,
)
from controlplane.replication import record_sweep, tasks
from controlplane.replication.flows import ReadCache
from gateway.metrics import GatewayMetrics
from gateway.routing_table import ModelVersion, StaticRoutingTable
from gateway.schemas import CompletionRequest
from gateway.sessions import SessionKeeper, SessionTurn
from gateway.settings import SessionsConfig
from tests.integration.replication.conftest import ROOT, write_checkpoint
from tests.integration.replication.test_replication_flows import current_status, make_policy
from tests.integration.replication.test_replication_metrics import scrape

POLICY = {"model": "tiny", "session_class": "chat", "mode": "critical", "rpo_context_seconds": 60,
          "rpo_context_turns": 0, "revision": 1}
HEADERS = {"x-session-id": "s1", "x-session-class": "chat"}
LABELS = {"model": "tiny", "session_class": "chat"}


class RegionEngine:
    """An engine answering checkpointing completions (`contract.session.checkpoint_completion`): the prompt's full
    blocks (4 tokens each) written to its region's store."""

    def __init__(self, store: KVCheckpointStore, clock: Any) -> None:
        self.store = store
        self.clock = clock
        self.fail = False

    def handler(self, request: httpx.Request) -> httpx.Response:
        if self.fail:
            return httpx.Response(503, json={"error": {"type": "kv_store_unavailable", "message": "down"}})
        body = json.loads(request.content)
        ids, ask = body["prompt"], body["kv_transfer_params"][CHECKPOINT_PARAM]
        tokens = len(ids) // 4 * 4
        key = write_checkpoint(self.store, ids[:tokens], created_at=self.clock.wall(),
                               session_class=ask.get("session_class"))
        last = key.rsplit("/", 1)[1].removesuffix(".json")
        written = KVCheckpointWritten(root_hash=ROOT, last_hash=last, key=key, blocks=tokens // 4, tokens=tokens,
                                      computed_tokens=0)
        return httpx.Response(200, json={"choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
                                         "kv_transfer_params": {CHECKPOINT_PARAM: written.model_dump()}})


def region_keeper(store_url: str, engine: RegionEngine, clock: Any) -> SessionKeeper:
    return SessionKeeper(SessionsConfig(store=store_url, policies=[POLICY]), StaticRoutingTable([]),
                         GatewayMetrics(), clock, http=httpx.AsyncClient(transport=httpx.MockTransport(engine.handler)))


async def open_turn(keeper: SessionKeeper, version: ModelVersion, prompt: list[int]) -> SessionTurn:
    turn = await keeper.open(HEADERS, CompletionRequest(model="tiny", prompt=prompt), version, prompt)
    assert turn is not None
    return turn


async def serve_turn(keeper: SessionKeeper, version: ModelVersion, prompt: list[int], answer: list[int]) -> None:
    """One completion turn at a region's gateway: opened, answered, recorded (and checkpointed)."""
    turn = await open_turn(keeper, version, prompt)
    keeper.finish(turn, engine_url="http://engine", engine_model=version.version, answer_ids=answer, answer_text="")
    await keeper.wait_recorded()


def sweep(session_factory: Any, policy_id: int, clock: Any, cache: ReadCache) -> list[str]:
    """One sweep of the policy, as the beat's sends it: its checkpoints planned, then its store's records."""
    keys = tasks.plan(session_factory, policy_id, clock=clock, s3_endpoint_url=None, ages=cache)
    record_sweep.sync_store(session_factory, [policy_id], clock=clock, s3_endpoint_url=None, cache=cache)
    return keys


def worker_sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, {**LABELS, **labels}) or 0.0


@pytest.mark.parametrize("backends", [("filesystem", "redis"), ("redis", "filesystem")])
async def test_a_completion_sessions_record_reaches_the_standby_and_claims_its_checkpoint_only_once_there(
        session_factory, clock, store_urls, client, backends, tmp_path: Path):
    (source_url, _), (target_url, _) = store_urls(backends[0], "region-a"), store_urls(backends[1], "region-b")
    source = KVCheckpointStore(open_kv_store(source_url))
    target = KVCheckpointStore(open_kv_store(target_url))
    policy_id = make_policy(session_factory, clock, source_url, target_url)  # critical, RPO_context 60 s
    cache = ReadCache()  # the worker's
    version = ModelVersion("tiny", "tiny-v1", tmp_path)
    engine_a = RegionEngine(source, clock)
    region_a = region_keeper(source_url, engine_a, clock)
    region_b = region_keeper(target_url, RegionEngine(target, clock), clock)

    prompt = list(range(1, 11))
    await serve_turn(region_a, version, prompt, list(range(11, 17)))
    prompt = [*prompt, *range(11, 17), 17, 18, 19]
    await serve_turn(region_a, version, prompt, list(range(20, 26)))
    written = region_a.records.get("tiny", "s1")
    assert written is not None and written.replicated_at is None
    assert (written.turns, written.context_tokens, written.checkpointed_tokens) == (2, 25, 24)
    clock.advance(2)

    before = {outcome: worker_sample("lifeline_replication_session_records_total", outcome=outcome)
              for outcome in ("replicated", "without_checkpoint")}
    lags_before = worker_sample("lifeline_replication_session_record_lag_seconds_count")
    keys = sweep(session_factory, policy_id, clock, cache)
    assert written.checkpoint_key in keys and target.manifests() == []  # the checkpoints are only queued

    # B's gateway knows the session now: its turns and its context, the previous turn served elsewhere.
    next_prompt = [*prompt, *range(20, 26), 26, 27]
    early = await open_turn(region_b, version, next_prompt)
    assert (early.turn, early.context_tokens, early.continuity) == (3, 25, "elsewhere")
    assert early.record is not None and early.record.checkpoint_key is None  # never a checkpoint B lacks
    assert early.record.checkpointed_turn == 0
    assert worker_sample("lifeline_replication_session_records_total", outcome="without_checkpoint") == \
        before["without_checkpoint"] + 1
    assert worker_sample("lifeline_replication_session_record_lag_seconds_count") == lags_before + 1
    assert current_status(session_factory, clock)["last_lag_seconds"] == pytest.approx(2)  # the record's

    for key in keys:
        assert tasks.copy(session_factory, policy_id, key, clock=clock, s3_endpoint_url=None) == "replicated"
    assert sweep(session_factory, policy_id, clock, cache) == []
    late = await open_turn(region_b, version, next_prompt)
    assert late.record is not None and late.record.replicated_at == pytest.approx(clock.wall())
    assert late.record.model_copy(update={"replicated_at": None}) == written  # A's record, whole
    assert written.checkpoint_key in target.manifests()
    assert worker_sample("lifeline_replication_session_records_total", outcome="replicated") == \
        before["replicated"] + 1
    assert worker_sample("lifeline_replication_session_record_lag_seconds_count") == lags_before + 1  # one turn

    # A third turn whose checkpoint fails at A: only its record is pending, and its age is the lag.
    engine_a.fail = True
    await serve_turn(region_a, version, next_prompt, list(range(28, 34)))
    clock.advance(31)  # past the probe's TTL
    seen = scrape(client)
    assert (seen["pending_checkpoints"], seen["pending_session_records"]) == (0, 1)
    assert seen["oldest_pending_age_seconds"] == pytest.approx(31)
    assert seen["lag_seconds"] == pytest.approx(31) and seen["within_rpo"] == 1
    assert sweep(session_factory, policy_id, clock, cache) == []
    third = await open_turn(region_b, version, [*next_prompt, *range(28, 34), 35])
    assert (third.turn, third.context_tokens) == (4, len(next_prompt) + 6)
    assert third.record is not None and third.record.checkpoint_key == written.checkpoint_key  # turn 2's, there
    clock.advance(31)
    assert scrape(client)["pending_session_records"] == 0
    for keeper in (region_a, region_b):
        await keeper.close()


async def test_records_that_are_not_records_are_skipped_counted_and_the_sweep_goes_on(
        session_factory, clock, store_urls, client, tmp_path: Path):
    (source_url, _), (target_url, _) = store_urls("filesystem", "region-a"), store_urls("redis", "region-b")
    source = KVCheckpointStore(open_kv_store(source_url))
    target = KVCheckpointStore(open_kv_store(target_url))
    policy_id = make_policy(session_factory, clock, source_url, target_url)
    cache = ReadCache()
    version = ModelVersion("tiny", "tiny-v1", tmp_path)
    region_a = region_keeper(source_url, RegionEngine(source, clock), clock)
    await serve_turn(region_a, version, list(range(1, 11)), list(range(11, 17)))
    other = SessionRecord(session_id="s2", model="tiny", session_class="chat", started_at=clock.wall(), turns=1,
                          recorded_at=clock.wall())
    bad = {session_key("tiny", "malformed"): b'{"session_id": ',
           session_key("tiny", "oversized"): b" " * (MAX_SESSION_RECORD_BYTES + 1),
           session_key("tiny", "misplaced"): other.model_dump_json().encode()}
    for key, data in bad.items():
        source.store.put(key, data)
    source.store.put("sessions/not-a-session-key.json", b"{}")  # a name no gateway writes: misplaced too
    target.store.put(session_key("tiny", "s1"), b"garbage")  # the destination's copy is unreadable: replaced
    before = {(reason, side): worker_sample("lifeline_replication_session_records_invalid_total", reason=reason,
                                            side=side)
              for reason, side in [("malformed", "source"), ("oversized", "source"), ("misplaced", "source"),
                                   ("malformed", "destination")]}

    keys = sweep(session_factory, policy_id, clock, cache)
    assert len(keys) == 1  # the checkpoint is planned all the same
    for (reason, side), count in before.items():
        assert worker_sample("lifeline_replication_session_records_invalid_total", reason=reason,
                             side=side) == count + (2 if reason == "misplaced" else 1), (reason, side)
    assert target.store.list("sessions/") == [session_key("tiny", "s1")]  # none of the bad ones
    assert current_status(session_factory, clock)["last_error"] is None
    assert scrape(client)["session_records_invalid"] == 4  # the source's four; B's was replaced

    region_b = region_keeper(target_url, RegionEngine(target, clock), clock)
    turn = await open_turn(region_b, version, [*range(1, 17), 17])
    assert turn.record is not None and (turn.turn, turn.context_tokens, turn.continuity) == (2, 16, "elsewhere")
    target.store.put(session_key("tiny", "s1"), b"{" * 10)  # a gateway reading garbage starts from the request
    assert (await open_turn(region_b, version, [*range(1, 17), 17])).record is None
    for keeper in (region_a, region_b):
        await keeper.close()
