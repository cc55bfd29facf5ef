"""The control plane's /metrics reports replication lag against RPO_context, computed at scrape time from the
database and the real stores (a directory and Redis), on SQLite and PostgreSQL, on virtual time."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from contract.kv_checkpoint import KVCheckpointStore, open_kv_store
from controlplane.replication import tasks
from controlplane.replication.exposition import PREFIX, ReplicationCollector
from tests.integration.replication.conftest import write_checkpoint
from tests.integration.replication.test_replication_dead_letters import corrupt_block, dead_letter
from tests.integration.replication.test_replication_flows import make_policy


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name without the prefix, labels other than model/session_class/destination) → value."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(PREFIX):
                rest = tuple(sorted((k, v) for k, v in sample.labels.items()
                                    if k not in ("model", "session_class", "destination")))
                found[(sample.name.removeprefix(PREFIX), rest)] = sample.value
    return found


def scrape(client: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert "hunter2" not in response.text
    return {name: value for (name, rest), value in samples(response.text).items() if not rest} | {
        f"{name}:{dict(rest)['state']}": value for (name, rest), value in samples(response.text).items() if rest}


@pytest.fixture(autouse=True)
def generous_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy machine must not make a scrape miss its budget: the budget has a test of its own."""
    monkeypatch.setenv("LIFELINE_REPLICATION_METRICS_BUDGET", "PT60S")


@pytest.fixture
def stores(store_urls: Any) -> tuple[str, str, KVCheckpointStore, KVCheckpointStore]:
    source_url, _ = store_urls("filesystem", "primary")
    target_url, _ = store_urls("redis", "standby")
    return (source_url, target_url, KVCheckpointStore(open_kv_store(source_url)),
            KVCheckpointStore(open_kv_store(target_url)))


def test_metrics_show_the_oldest_pending_checkpoint_against_the_rpo_cached_for_the_probe_ttl(
        session_factory, clock, stores, client):
    source_url, target_url, source, target = stores
    policy_id = make_policy(session_factory, clock, source_url, target_url)  # critical, RPO_context 60 s
    now = clock.wall()
    copied = write_checkpoint(source, list(range(500, 504)), created_at=now - 100, seed=3)
    assert tasks.copy(session_factory, policy_id, copied, clock=clock, s3_endpoint_url=None) == "replicated"
    first = write_checkpoint(source, list(range(8)), created_at=now - 40)
    write_checkpoint(source, list(range(100, 108)), created_at=now - 10, seed=1)
    write_checkpoint(source, list(range(200, 208)), created_at=now - 7200, seed=2)  # past retention: not pending

    seen = scrape(client)
    assert seen["scrape_ok"] == 1 and seen["probe_ok"] == 1 and seen["probe_truncated"] == 0
    assert (seen["rpo_context_seconds"], seen["pending_checkpoints"]) == (60, 2)
    assert seen["oldest_pending_age_seconds"] == pytest.approx(40)
    assert seen["lag_seconds"] == pytest.approx(40) and seen["within_rpo"] == 1
    assert seen["lag_rpo_ratio"] == pytest.approx(40 / 60)
    assert seen["last_copy_lag_seconds"] == pytest.approx(100)
    assert (seen["replicated_total"], seen["blocks_copied_total"]) == (1, 1)
    assert seen["dead_letters:dead"] == 0

    clock.advance(10)  # within the probe TTL (30 s): the stores are not read again, the age still grows
    write_checkpoint(source, list(range(300, 308)), created_at=clock.wall(), seed=4)
    seen = scrape(client)
    assert seen["pending_checkpoints"] == 2 and seen["probe_age_seconds"] == pytest.approx(10)
    assert seen["oldest_pending_age_seconds"] == pytest.approx(50)

    clock.advance(25)  # past the TTL: probed again; the oldest pending is now 75 s old, past the 60 s target
    seen = scrape(client)
    assert seen["pending_checkpoints"] == 3 and seen["probe_age_seconds"] == 0
    assert seen["lag_seconds"] == pytest.approx(75) and seen["within_rpo"] == 0
    assert seen["lag_rpo_ratio"] == pytest.approx(75 / 60)

    for key in tasks.plan(session_factory, policy_id, clock=clock, s3_endpoint_url=None):
        tasks.copy(session_factory, policy_id, key, clock=clock, s3_endpoint_url=None)
    clock.advance(30)
    seen = scrape(client)
    assert (seen["pending_checkpoints"], seen["oldest_pending_age_seconds"]) == (0, 0)
    assert seen["lag_seconds"] == pytest.approx(seen["last_copy_lag_seconds"]) and seen["replicated_total"] == 4
    assert seen["last_sweep_age_seconds"] == pytest.approx(30)
    assert first in target.manifests()


def test_dead_letters_are_counted_by_state_and_not_pending(session_factory, clock, stores, client):
    source_url, target_url, source, _ = stores
    policy_id = make_policy(session_factory, clock, source_url, target_url)
    key = write_checkpoint(source, list(range(12)), created_at=clock.wall() - 5)
    corrupt_block(source, key)
    dead_letter(session_factory, clock, policy_id, key)
    seen = scrape(client)
    assert (seen["dead_letters:dead"], seen["dead_letters:retrying"], seen["pending_checkpoints"]) == (1, 0, 0)
    assert "lag_seconds" not in seen  # nothing pending, nothing ever copied: no lag to report


def test_a_probe_reads_at_most_its_cap_and_catches_up_on_later_probes(session_factory, clock, stores):
    source_url, target_url, source, _ = stores
    make_policy(session_factory, clock, source_url, target_url)
    now = clock.wall()
    for i, age in enumerate((30, 20, 10)):
        write_checkpoint(source, list(range(i * 100, i * 100 + 8)), created_at=now - age, seed=i)
    collector = ReplicationCollector(session_factory, clock=clock, s3_endpoint_url=None,
                                     probe_ttl=timedelta(seconds=30), max_reads=1, budget=timedelta(seconds=60))

    def collect() -> dict[str, float]:
        return {s.name.removeprefix(PREFIX): s.value for f in collector.collect() for s in f.samples}

    truncated = []
    for _ in range(3):
        seen = collect()
        truncated.append(seen["probe_truncated"])
        assert seen["pending_checkpoints"] == 3  # every pending one counted, read or not
        clock.advance(30)
    assert truncated == [1, 1, 0] and collector.probes_taken == 3
    assert seen["oldest_pending_age_seconds"] == pytest.approx(30 + 60)  # once all three were read
    collect()
    assert collector.probes_taken == 4  # a new probe lists again but reads no manifest twice


def test_a_store_that_does_not_answer_is_reported_and_the_page_still_answers(session_factory, clock, tmp_path,
                                                                            client):
    make_policy(session_factory, clock, f"file://{tmp_path / 'primary'}",
                "redis://127.0.0.1:1/0?socket_timeout=1&socket_connect_timeout=1")
    seen = scrape(client)
    assert (seen["scrape_ok"], seen["probe_ok"], seen["rpo_context_seconds"]) == (1, 0, 60)
    assert "lag_seconds" not in seen and "pending_checkpoints" not in seen


def test_a_store_that_hangs_past_the_budget_leaves_the_page_answering(session_factory, clock, stores):
    import threading

    source_url, target_url, source, _ = stores
    make_policy(session_factory, clock, source_url, target_url)
    write_checkpoint(source, list(range(8)), created_at=clock.wall() - 5)
    release, opened = threading.Event(), []

    def hanging_open(url: str) -> KVCheckpointStore:
        opened.append(url)
        release.wait()  # a store that accepts and never answers, until the test lets it
        return KVCheckpointStore(open_kv_store(url))

    collector = ReplicationCollector(session_factory, clock=clock, s3_endpoint_url=None,
                                     budget=timedelta(seconds=0.2), open_store=hanging_open)

    def collect() -> dict[str, float]:
        return {s.name.removeprefix(PREFIX): s.value for f in collector.collect() for s in f.samples}

    assert collect() == {"scrape_ok": 0}
    assert collect() == {"scrape_ok": 0} and len(opened) == 1  # waits on the read in flight, starts no other
    release.set()
    collector._in_flight.result(timeout=60)  # the hung read ends; the next scrape reads afresh
    collector.budget = 60  # generous from here on: only the short budget above is under test
    seen = collect()
    assert (seen["scrape_ok"], seen["pending_checkpoints"]) == (1, 1)
