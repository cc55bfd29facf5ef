"""The KV store's additions for retention, on all three backends (a directory, Redis, S3 on moto's emulator):
list manifests by age and delete a checkpoint without deleting blocks a kept checkpoint names."""

from __future__ import annotations

import pytest

from contract.kv_checkpoint import KVCheckpointStore, block_key, open_kv_store, redact_kv_store_url, split_manifest_key
from tests.integration.replication.conftest import ROOT, write_checkpoint


@pytest.mark.parametrize("backend", ["filesystem", "redis", "s3"])
def test_old_checkpoints_are_listed_by_age_and_deleted_keeping_shared_blocks(store_urls, backend):
    url, endpoint = store_urls(backend, "standby")
    store = KVCheckpointStore(open_kv_store(url, s3_endpoint_url=endpoint))
    tokens = list(range(24))
    old = write_checkpoint(store, tokens[:8], created_at=1000.0)  # 2 blocks
    new = write_checkpoint(store, tokens[:16], created_at=5000.0)  # the same 2 blocks and 2 more
    undated = write_checkpoint(store, tokens[:24], created_at=None)
    assert store.manifests_older_than(4000.0) == [old]
    assert store.manifests_older_than(999.0) == []

    kept = [k for k in store.manifests() if k != old]
    assert store.delete_checkpoint(old, keep_blocks=store.block_hashes(kept)) == 0  # every block still named
    assert sorted(store.manifests()) == sorted([new, undated])
    manifest = store.manifest_at(new)
    assert all(store.store.exists([block_key(ROOT, b.hash) for b in manifest.blocks]))

    assert store.manifests_older_than(10**12) == [new]  # the undated one is never aged out
    assert store.delete_checkpoint(undated, keep_blocks=store.block_hashes([new])) == 2  # its own 2 blocks
    assert store.delete_checkpoint(new, keep_blocks=frozenset()) == 4
    assert store.manifests() == []
    assert store.store.list("kv/") == []

def test_manifest_keys_split_and_urls_are_redacted():
    assert split_manifest_key(f"kv/{ROOT}/manifests/{'c' * 64}.json") == (ROOT, "c" * 64)
    with pytest.raises(ValueError):
        split_manifest_key(f"kv/{ROOT}/blocks/{'c' * 64}.safetensors")
    assert redact_kv_store_url("redis://:s3cret@h:6379/0?key_prefix=a:") == "redis://:***@h:6379/0?key_prefix=a:"
    assert redact_kv_store_url("redis+sentinel://u:s3cret@h1:1,h2:2/svc?sentinel_password=x") == (
        "redis+sentinel://u:***@h1:1,h2:2/svc?sentinel_password=***")
    assert redact_kv_store_url("s3://bucket/prefix") == "s3://bucket/prefix"
    assert redact_kv_store_url("/var/kv") == "/var/kv"
