"""The KV pool's ledger: reserve → commit → lookup, across restarts, takeovers and corruption."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from common.clock import ManualClock
from contract.holder import kv_block_hash
from holder.errors import KVConflict
from holder.ledger import read_records
from holder.service import LEDGER_FILE, MemoryHolder
from holder.settings import HolderSettings

BLOCK = 4  # tokens per block
CONFIG = {"hidden_size": 4, "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 1,
          "rope_theta": 10000.0}


@pytest.fixture
def settings(tmp_path: Path) -> HolderSettings:
    model = tmp_path / "model"
    model.mkdir()
    save_file({"w": np.ones((2, 2), np.float32)}, str(model / "model-00001-of-00001.safetensors"))
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "model-00001-of-00001.safetensors"}}))
    (model / "config.json").write_text(json.dumps(CONFIG))
    return HolderSettings(model=model, state_dir=tmp_path / "state", shm_dir=tmp_path / "shm", kv_blocks=4,
                          kv_block_tokens=BLOCK, lease_ttl=timedelta(seconds=2), heartbeat_interval=timedelta(seconds=1))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def started(settings: HolderSettings, clock: ManualClock) -> MemoryHolder:
    holder = MemoryHolder(settings, clock)
    holder.open()
    holder.ensure_weights()
    holder.ensure_kv_pool()
    return holder


def write_block(holder: MemoryHolder, block: int, value: float) -> None:
    """What a tenant does through its own mapping of the pool file."""
    layout = holder.kv.layout
    pool = np.memmap(holder.kv.region.path, dtype=np.uint8, mode="r+")
    pool[block * layout.block_bytes:(block + 1) * layout.block_bytes].view(layout.dtype)[:] = value
    pool.flush()


def commit_chain(holder: MemoryHolder, tenant: str, generation: int, tokens: list[int]) -> list[int]:
    parent, blocks = holder.kv.root_hash, []
    for start in range(0, len(tokens), BLOCK):
        [block] = holder.kv_reserve(tenant, generation, 1)
        write_block(holder, block, float(start + 1))
        ref = holder.kv_commit(tenant, generation, block, parent, tokens[start:start + BLOCK])
        parent = ref.hash
        blocks.append(ref.block)
    return blocks


TOKENS = list(range(100, 112))  # three blocks


def test_lookup_returns_the_longest_committed_chain_for_a_prefix(settings, clock):
    holder = started(settings, clock)
    holder.attach("engine-a", 1)
    blocks = commit_chain(holder, "engine-a", 1, TOKENS)
    assert blocks == [0, 1, 2]  # free blocks in id order
    assert [r.block for r in holder.kv_lookup(TOKENS + [7, 7]).blocks] == [0, 1, 2]
    assert [r.block for r in holder.kv_lookup(TOKENS[:9]).blocks] == [0, 1]
    assert holder.kv_lookup([*TOKENS[:4], 0, *TOKENS[5:]]).blocks[-1].block == 0  # diverges in block 1
    assert holder.kv_lookup([1, 2, 3]).blocks == []  # shorter than a block


def test_a_block_is_named_by_its_whole_prefix(settings, clock):
    holder = started(settings, clock)
    holder.attach("engine-a", 1)
    commit_chain(holder, "engine-a", 1, TOKENS[:8])
    other_first = [9, 9, 9, 9, *TOKENS[4:8]]  # same second block tokens, another first block
    assert holder.kv_lookup(other_first).blocks == []
    expected = kv_block_hash(kv_block_hash(holder.kv.root_hash, TOKENS[:4]), TOKENS[4:8])
    assert holder.kv_lookup(TOKENS[:8]).blocks[1].hash == expected


def test_a_corrupted_block_is_discarded_and_the_chain_ends_before_it(settings, clock):
    holder = started(settings, clock)
    holder.attach("engine-a", 1)
    commit_chain(holder, "engine-a", 1, TOKENS)
    write_block(holder, 1, -1.0)  # a bad page in the middle block
    found = holder.kv_lookup(TOKENS)
    assert ([r.block for r in found.blocks], found.discarded) == ([0], [1])
    assert [r["op"] for r in read_records((settings.state_dir / LEDGER_FILE).read_bytes())[0]][-1] == "kv_free"
    assert [r.block for r in holder.kv_lookup(TOKENS).blocks] == [0]  # never vouched for again
    assert holder.kv_summary()["committed"] == 2


def test_committed_blocks_survive_a_holder_restart(settings, clock):
    first = started(settings, clock)
    first.attach("engine-a", 1)
    commit_chain(first, "engine-a", 1, TOKENS)
    first.close(clean=False)
    second = started(settings, clock)
    assert second.kv.region.region_id == first.kv.region.region_id
    assert [r.block for r in second.kv_lookup(TOKENS).blocks] == [0, 1, 2]


def test_a_successor_gets_its_predecessors_uncommitted_blocks_first(settings, clock):
    holder = started(settings, clock)
    holder.attach("engine-a", 1)
    assert holder.kv_reserve("engine-a", 1, 2) == [0, 1]
    clock.advance(5)  # engine-a generation 1 died holding blocks 0 and 1
    holder.attach("engine-b", 1)
    assert holder.kv_reserve("engine-b", 1, 4) == [2, 3]  # never the frozen tenant's 0 and 1
    with pytest.raises(KVConflict, match="not reserved by 'engine-b'"):
        holder.kv_commit("engine-b", 1, 0, holder.kv.root_hash, TOKENS[:4])
    holder.attach("engine-a", 2)
    assert holder.kv_reserve("engine-a", 2, 2) == [0, 1]
    with pytest.raises(KVConflict):  # block 2 is engine-b's
        holder.kv_commit("engine-a", 2, 2, holder.kv.root_hash, TOKENS[:4])


def test_commits_must_follow_the_chain_and_the_reservation(settings, clock):
    holder = started(settings, clock)
    holder.attach("engine-a", 1)
    [block] = holder.kv_reserve("engine-a", 1, 1)
    with pytest.raises(KVConflict, match="parent block is not committed"):
        holder.kv_commit("engine-a", 1, block, "f" * 64, TOKENS[:4])
    with pytest.raises(KVConflict, match="holds 4 tokens"):
        holder.kv_commit("engine-a", 1, block, holder.kv.root_hash, TOKENS[:3])
    with pytest.raises(KVConflict, match="not reserved"):
        holder.kv_commit("engine-a", 1, block + 1, holder.kv.root_hash, TOKENS[:4])


def test_a_duplicate_prefix_frees_the_new_block_and_names_the_old(settings, clock):
    holder = started(settings, clock)
    holder.attach("engine-a", 1)
    [first] = commit_chain(holder, "engine-a", 1, TOKENS[:4])
    [again] = holder.kv_reserve("engine-a", 1, 1)
    assert holder.kv_commit("engine-a", 1, again, holder.kv.root_hash, TOKENS[:4]).block == first
    assert holder.kv_summary()["reserved"] == 0


def test_a_full_pool_evicts_the_oldest_blocks_of_live_tenants_only(settings, clock):
    holder = started(settings, clock)
    holder.attach("engine-a", 1)
    commit_chain(holder, "engine-a", 1, TOKENS)  # blocks 0, 1, 2
    holder.attach("engine-b", 1)
    assert holder.kv_reserve("engine-b", 1, 2) == [3, 0]  # the free one, then the oldest committed
    clock.advance(5)  # engine-a is frozen now: its blocks 1 and 2 stay
    holder.heartbeat("engine-b", 1)
    assert holder.kv_reserve("engine-b", 1, 2) == []


def test_a_clean_release_frees_the_tenants_uncommitted_blocks(settings, clock):
    holder = started(settings, clock)
    holder.attach("engine-a", 1)
    holder.kv_reserve("engine-a", 1, 3)
    holder.release("engine-a", 1)
    assert holder.kv_summary()["reserved"] == 0
