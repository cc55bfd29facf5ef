"""KV checkpoint replication by real Celery processes on RabbitMQ, between two regions' stores.

- a checkpoint a real engine wrote to the primary's store (a directory) is replicated by beat + worker to
  the standby's (Redis for one session class, S3 on moto's emulator for another), verified there, and a
  standby engine imports it instead of prefilling;
- a worker SIGKILLed mid-copy leaves no manifest at the standby; the task is redelivered to the next
  worker and the copy is complete and verified;
- a corrupted block at the source is never copied: the copy is retried by Celery, dead-lettered after the
  policy's attempts and shown in GET /api/v1/replication/status and the event log; once the source is
  fixed, an operator's retry over the API has the running worker copy it, and the API's own /metrics
  shows the dead letter gone and nothing pending.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest
from fastapi.testclient import TestClient

from common.clock import SystemClock
from common import oneshot_http
from contract.kv_checkpoint import KVCheckpointStore, block_object_checksum, open_kv_store, verify_manifest
from controlplane.app import create_app
from controlplane.auth import service as auth_service
from controlplane.auth.roles import Role
from controlplane.config import ControlPlaneSettings
from controlplane.db import session_scope
from controlplane.replication import service
from controlplane.replication.schemas import ReplicationPolicySpec
from controlplane.replication.tasks import COPY
from lifeline.processes import scrape_metric
from tests.e2e.kv.conftest import PROMPT, metric, prompt_ids, tokens
from tests.e2e.replication.conftest import wait_for
from tests.integration.replication.conftest import ROOT, write_checkpoint

pytestmark = pytest.mark.long  # scheduled first in its tier (tests/conftest.py)


def set_policy(session_factory: Any, session_class: str, source: str, target: str, **extra: Any) -> int:
    spec = ReplicationPolicySpec(**{"model": "tiny", "session_class": session_class, "mode": "critical",
                                    "rpo_context_seconds": 60, "source_store": source, "destination_store": target,
                                    "retention_seconds": 3600, "max_attempts": 3, "reason": "e2e", **extra})
    with session_scope(session_factory) as session:
        return service.put_policy(session, spec=spec, actor="test", clock=SystemClock()).id


def status_of(session_factory: Any, session_class: str) -> dict[str, Any]:
    with session_scope(session_factory) as session:
        rows = service.status(session, clock=SystemClock()).policies
        return next(r.model_dump(mode="json") for r in rows if r.session_class == session_class)


def assert_whole(store: KVCheckpointStore, key: str) -> int:
    """Every block the manifest names is there with its sha256; the number of blocks."""
    manifest = store.manifest_at(key)
    assert manifest is not None, key
    verify_manifest(manifest)
    for entry in manifest.blocks:
        data = store.read_block(manifest.root_hash, entry.hash)
        assert data is not None and block_object_checksum(data, manifest.validity) == entry.checksum
    return len(manifest.blocks)


def test_an_engines_checkpoints_are_replicated_to_redis_and_s3_and_imported_at_the_standby(
        engine_factory, replication, session_factory, store_urls, tmp_path):
    primary = f"file://{tmp_path / 'primary-kv'}"
    redis_url, _ = store_urls("redis", "standby")
    s3_url, endpoint = store_urls("s3", "standby")
    writer = engine_factory("kv-writer", extra_args=["--kv-checkpoint-store", primary, "--kv-checkpoint-every", "8"])
    ids = prompt_ids(writer, PROMPT)
    expected = tokens(writer, PROMPT, 32)
    wait_for(lambda: metric(writer, "lifeline_engine_kv_checkpoints_total", {"outcome": "written"}) >= 1,
             "a checkpoint written")
    source = KVCheckpointStore(open_kv_store(primary))

    set_policy(session_factory, "chat", primary, redis_url)
    set_policy(session_factory, "batch", primary, s3_url, mode="interactive", every_seconds=1, every_turns=2)
    celery = replication(LIFELINE_CONTROLPLANE_S3_ENDPOINT_URL=endpoint)
    worker = celery.start("worker")
    celery.start("beat")
    standby_redis = KVCheckpointStore(open_kv_store(redis_url))
    standby_s3 = KVCheckpointStore(open_kv_store(s3_url, s3_endpoint_url=endpoint))
    wait_for(lambda: set(standby_redis.manifests()) >= set(source.manifests())
             and set(standby_s3.manifests()) >= set(source.manifests()), "replicated to both standbys", timeout=90)
    written = source.manifests()
    assert written
    for key in written:
        assert assert_whole(standby_redis, key) == assert_whole(standby_s3, key) == assert_whole(source, key)
    for session_class in ("chat", "batch"):
        status = wait_for(lambda: (s := status_of(session_factory, session_class))["pending"] == 0
                          and s["last_sweep_at"] and s, f"{session_class} swept with nothing pending")
        assert status["replicated_total"] == len(written) and status["dead_letters"] == []
        assert status["last_lag_seconds"] is not None and status["last_lag_seconds"] >= 0
    page = f"http://127.0.0.1:{worker.metrics_port}/metrics"
    assert scrape_metric(page, "lifeline_replication_copies_total",
                         {"model": "tiny", "session_class": "chat", "outcome": "replicated"}) == len(written)
    assert scrape_metric(page, "lifeline_replication_lag_seconds_count",
                         {"model": "tiny", "session_class": "batch"}) == len(written)

    # The standby region's engine reads only its own store, and imports the replicated checkpoint.
    standby = engine_factory("kv-standby", extra_args=["--kv-checkpoint-store", redis_url])
    continuation = ids + expected[:20]
    response = oneshot_http.post(f"{standby.url}/v1/completions", timeout=120,
                                 json={"prompt": continuation, "max_tokens": 12, "temperature": 0.0, "ignore_eos": True,
                                "return_token_ids": True})
    response.raise_for_status()
    assert expected[:20] + response.json()["choices"][0]["token_ids"] == expected
    assert metric(standby, "lifeline_engine_kv_imported_tokens_total") > 0


def test_a_worker_killed_mid_copy_leaves_no_manifest_and_the_redelivered_copy_completes(
        replication, session_factory, store_urls):
    source_url, _ = store_urls("filesystem", "primary")
    target_url, _ = store_urls("redis", "standby")
    source = KVCheckpointStore(open_kv_store(source_url))
    target = KVCheckpointStore(open_kv_store(target_url))
    blocks = 8000  # enough that a copy is still running when the test kills its worker
    key = write_checkpoint(source, list(range(blocks * 4)), created_at=SystemClock().wall())
    policy_id = set_policy(session_factory, "chat", source_url, target_url)

    celery = replication()
    first = celery.start("worker")
    celery.celery().send_task(COPY, args=(policy_id, key), queue=celery.queue)
    wait_for(lambda: len(target.store.list(f"kv/{ROOT}/blocks/")) >= 300, "the copy under way")
    first.kill(signal.SIGKILL)
    copied = len(target.store.list(f"kv/{ROOT}/blocks/"))
    assert 0 < copied < blocks
    assert target.manifests() == []  # cut short: no manifest naming blocks that are not there

    celery.start("worker")  # the broker redelivers the unacknowledged copy
    wait_for(lambda: target.manifests() == [key], "the copy redelivered and finished", timeout=120)
    assert assert_whole(target, key) == blocks
    status = wait_for(lambda: (s := status_of(session_factory, "chat"))["replicated_total"] and s, "counted")
    assert status["replicated_total"] == 1 and status["dead_letters"] == []


def test_a_corrupt_source_block_is_never_copied_and_is_dead_lettered_in_the_status_api(
        replication, session_factory, store_urls, database_url, tmp_path):
    source_url, _ = store_urls("filesystem", "primary")
    target_url, _ = store_urls("redis", "standby")
    source = KVCheckpointStore(open_kv_store(source_url))
    target = KVCheckpointStore(open_kv_store(target_url))
    now = SystemClock().wall()
    good = write_checkpoint(source, list(range(8)), created_at=now, seed=1)
    bad = write_checkpoint(source, list(range(100, 112)), created_at=now, seed=2)
    entry = source.manifest_at(bad).blocks[2]
    original = source.read_block(ROOT, entry.hash)
    data = bytearray(original)
    data[-1] ^= 0x04
    source.write_block(ROOT, entry.hash, bytes(data))
    set_policy(session_factory, "chat", source_url, target_url, max_attempts=3)

    celery = replication()
    worker = celery.start("worker")
    celery.start("beat")
    status = wait_for(lambda: (s := status_of(session_factory, "chat"))["dead_letters"] and s, "a dead letter",
                      timeout=90)
    assert [(d["checkpoint_key"], d["attempts"]) for d in status["dead_letters"]] == [(bad, 3)]
    assert "does not match the manifest" in status["dead_letters"][0]["error"]
    wait_for(lambda: good in target.manifests(), "the good checkpoint replicated")
    assert bad not in target.manifests()
    assert not target.store.exists([f"kv/{ROOT}/blocks/{entry.hash}.safetensors"])[0]  # the corrupt block: never
    assert "Retry in" in worker.logs()  # Celery's own retry, with its countdown
    page = f"http://127.0.0.1:{worker.metrics_port}/metrics"
    assert scrape_metric(page, "lifeline_replication_copies_total",
                         {"model": "tiny", "session_class": "chat", "outcome": "dead_lettered"}) >= 1

    with session_scope(session_factory) as session:
        _, secret = auth_service.create_token(session, name="viewer", role=Role.VIEWER, created_by="test",
                                              clock=SystemClock())
    app = create_app(ControlPlaneSettings(database_url=database_url, data_dir=tmp_path))
    with TestClient(app) as client:
        headers = {"Authorization": f"Bearer {secret}"}
        [row] = client.get("/api/v1/replication/status", headers=headers).json()["policies"]
        assert [d["checkpoint_key"] for d in row["dead_letters"]] == [bad]
        events = client.get("/api/v1/events", params={"kind": "replication.dead_letter"}, headers=headers).json()
        assert [(e["outcome"], e["after"]["checkpoint"], e["after"]["attempts"]) for e in events] == [
            ("failed", bad, 3)]

        source.write_block(ROOT, entry.hash, original)  # the operator fixed the source, then retries
        with session_scope(session_factory) as session:
            _, operator = auth_service.create_token(session, name="operator", role=Role.OPERATOR,
                                                    created_by="test", clock=SystemClock())
        retried = client.post("/api/v1/replication/dead-letters/retry", headers={
            "Authorization": f"Bearer {operator}"}, json={"model": "tiny", "session_class": "chat",
                                                          "checkpoint_keys": [bad], "reason": "source fixed"})
        assert retried.status_code == 200 and retried.json()["changed"] == [bad], retried.text
        wait_for(lambda: bad in target.manifests(), "the retried checkpoint replicated by the worker", timeout=90)
        assert_whole(target, bad)
        wait_for(lambda: not status_of(session_factory, "chat")["dead_letters"], "the dead letter gone")
        page = client.get("/metrics").text
        labels = 'model="tiny",session_class="chat"'
        assert any(line.startswith("lifeline_controlplane_replication_dead_letters{") and labels in line
                   and 'state="dead"' in line and line.endswith(" 0.0") for line in page.splitlines())
        assert any(line.startswith("lifeline_controlplane_replication_pending_checkpoints{") and labels in line
                   and line.endswith(" 0.0") for line in page.splitlines())
