"""The holder's four phases and its restart, on virtual time and temp files (a synthetic two-shard model)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from common.clock import ManualClock
from contract.holder import TenantState
from holder.errors import HolderNotReady, TenantSuperseded, UnknownTenant
from holder.service import LEDGER_FILE, MemoryHolder
from holder.settings import HolderSettings

TENSORS = {"a.weight": np.arange(12, dtype=np.float32).reshape(3, 4), "b.bias": np.array([0.5, -1.5, 2.25], np.float32),
           "c.weight": np.linspace(-1, 1, 10, dtype=np.float32).reshape(2, 5)}


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    save_file({k: TENSORS[k] for k in ("a.weight", "b.bias")}, str(model / "model-00001-of-00002.safetensors"))
    save_file({"c.weight": TENSORS["c.weight"]}, str(model / "model-00002-of-00002.safetensors"))
    weight_map = {"a.weight": "model-00001-of-00002.safetensors", "b.bias": "model-00001-of-00002.safetensors",
                  "c.weight": "model-00002-of-00002.safetensors"}
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (model / "config.json").write_text(json.dumps({"hidden_size": 4}))
    return model


@pytest.fixture
def settings(tmp_path: Path, model_dir: Path) -> HolderSettings:
    return HolderSettings(model=model_dir, state_dir=tmp_path / "state", shm_dir=tmp_path / "shm",
                          lease_ttl=timedelta(seconds=2.5), heartbeat_interval=timedelta(seconds=1))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def started(settings: HolderSettings, clock: ManualClock) -> MemoryHolder:
    holder = MemoryHolder(settings, clock)
    holder.open()
    holder.ensure_weights()
    return holder


def read_tensor(holder: MemoryHolder, name: str) -> np.ndarray:
    region = holder.ready_weights().region
    spec = next(t for t in region.tensors if t.name == name)
    data = np.fromfile(region.path, dtype=np.uint8)
    return data[spec.offset:spec.offset + spec.nbytes].view(spec.dtype).reshape(spec.shape)


def test_weights_are_held_in_the_tenants_dtype_at_aligned_offsets(settings, clock):
    holder = started(settings, clock)
    region = holder.ready_weights().region
    assert [t.name for t in region.tensors] == sorted(TENSORS)
    assert all(t.offset % 64 == 0 and t.dtype == "float64" for t in region.tensors)
    for name, expected in TENSORS.items():
        np.testing.assert_array_equal(read_tensor(holder, name), expected.astype(np.float64))
    assert region.checksum.startswith("sha256:") and region.epoch == 1


def test_a_restarted_holder_adopts_the_sealed_region_without_reloading(settings, clock):
    first = started(settings, clock)
    region = first.ready_weights().region
    first.close(clean=False)  # SIGKILL: nothing released
    second = MemoryHolder(settings, clock)
    report = second.open()
    assert (report.epoch, report.adopted, report.discarded) == (2, [region.region_id], {})
    assert second.ensure_weights().region == region  # same file, same id, sealed by epoch 1


def test_a_corrupt_region_is_discarded_and_loaded_again_under_a_new_id(settings, clock):
    first = started(settings, clock)
    region = first.ready_weights().region
    first.close(clean=False)
    with open(region.path, "r+b") as f:  # one flipped bit in the held weights
        f.seek(region.tensors[1].offset + 3)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x10]))
    second = MemoryHolder(settings, clock)
    report = second.open()
    assert report.discarded == {region.region_id: "checksum mismatch"}
    assert not Path(region.path).exists()
    fresh = second.ensure_weights().region
    assert fresh.region_id == region.region_id + 1
    np.testing.assert_array_equal(read_tensor(second, "b.bias"), TENSORS["b.bias"].astype(np.float64))


def test_a_region_reserved_but_never_sealed_is_a_miss(settings, clock):
    """The holder died while filling: a reserve record, a half-written file, no seal."""
    first = MemoryHolder(settings, clock)
    first.open()
    path = first.shm_dir / "region-000001.bin"
    first.record({"op": "reserve", "region": 1, "path": str(path), "size": 4096, "purpose": "weights",
                  "owner": "holder", "tensors": [], "meta": {}})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x01" * 100)
    first.close(clean=False)
    second = MemoryHolder(settings, clock)
    assert second.open().discarded == {1: "unsealed"}
    assert not path.exists()
    assert second.ensure_weights().region.region_id == 2


def test_a_torn_seal_replays_to_a_reserved_region_and_is_discarded(settings, clock):
    first = started(settings, clock)
    first.close(clean=False)
    ledger_path = settings.state_dir / LEDGER_FILE
    ledger_path.write_bytes(ledger_path.read_bytes()[:-7])  # killed while writing the seal
    second = MemoryHolder(settings, clock)
    report = second.open()
    assert report.torn_bytes > 0
    assert report.discarded == {1: "unsealed"}
    assert second.ensure_weights().region.region_id == 2


def test_files_no_record_names_are_removed(settings, clock):
    first = started(settings, clock)
    first.close(clean=False)
    orphan = first.shm_dir / "region-000099.bin"
    orphan.write_bytes(b"x")
    second = MemoryHolder(settings, clock)
    assert second.open().orphans_removed == 1
    assert not orphan.exists()


def test_a_clean_shutdown_releases_every_region(settings, clock):
    first = started(settings, clock)
    path = Path(first.ready_weights().region.path)
    first.close(clean=True)
    assert not path.exists()
    second = MemoryHolder(settings, clock)
    assert second.open().adopted == []
    assert [r["freed_reason"] for r in second.regions()] == ["holder shut down cleanly"]


def test_attach_waits_for_the_weights(settings, clock):
    holder = MemoryHolder(settings, clock)
    holder.open()
    with pytest.raises(HolderNotReady):
        holder.attach("engine-a", 1)


def test_a_silent_tenant_freezes_only_after_the_whole_lease(settings, clock):
    holder = started(settings, clock)
    holder.attach("engine-a", 1)
    clock.advance(1.0)
    holder.heartbeat("engine-a", 1)
    clock.advance(2.4)  # two missed heartbeats: still not dead
    assert holder.announce_frozen() == []
    clock.advance(0.2)
    [frozen] = holder.announce_frozen()
    assert (frozen.tenant_id, frozen.frozen, frozen.state) == ("engine-a", True, TenantState.ATTACHED)
    assert holder.announce_frozen() == []  # announced once


def test_a_newer_generation_takes_over_and_fences_the_old(settings, clock):
    holder = started(settings, clock)
    holder.attach("engine-a", 1)
    clock.advance(3.0)
    answer = holder.attach("engine-a", 2)
    assert answer.takeover and answer.tenant.state is TenantState.TAKING_OVER and answer.tenant.takeovers == 1
    with pytest.raises(TenantSuperseded):
        holder.heartbeat("engine-a", 1)
    with pytest.raises(TenantSuperseded):
        holder.attach("engine-a", 1)
    assert holder.confirm("engine-a", 2).state is TenantState.ATTACHED


def test_another_tenant_never_takes_a_frozen_tenants_place(settings, clock):
    holder = started(settings, clock)
    holder.attach("engine-a", 5)
    clock.advance(10.0)
    answer = holder.attach("engine-b", 1)
    assert not answer.takeover
    views = {t.tenant_id: t for t in holder.tenants()}
    assert views["engine-a"].frozen and views["engine-a"].generation == 5
    assert not views["engine-b"].frozen


def test_heartbeats_need_an_attach_of_that_generation(settings, clock):
    holder = started(settings, clock)
    with pytest.raises(UnknownTenant):
        holder.heartbeat("engine-a", 1)
    holder.attach("engine-a", 1)
    with pytest.raises(UnknownTenant):
        holder.heartbeat("engine-a", 2)
    holder.release("engine-a", 1)
    with pytest.raises(UnknownTenant):
        holder.heartbeat("engine-a", 1)


def test_a_holder_restart_gives_every_tenant_a_full_lease(settings, clock):
    first = started(settings, clock)
    first.attach("engine-a", 3)
    clock.advance(2.0)
    first.close(clean=False)
    second = started(settings, clock)
    [view] = second.tenants()
    assert (view.generation, view.frozen, view.lease_expires_in_s) == (3, False, 2.5)
    second.heartbeat("engine-a", 3)


def test_every_acknowledged_change_is_in_the_ledger_before_the_answer(settings, clock):
    holder = started(settings, clock)
    holder.attach("engine-a", 1)
    holder.attach("engine-a", 2)
    holder.confirm("engine-a", 2)
    holder.release("engine-a", 2)
    ops = [r["op"] for r in _records(settings)]
    assert ops == ["boot", "reserve", "seal", "attach", "attach", "confirm", "release"]


def _records(settings: HolderSettings) -> list[dict]:
    from holder.ledger import read_records

    return read_records((settings.state_dir / LEDGER_FILE).read_bytes())[0]


def test_a_second_holder_on_the_same_state_dir_is_refused(settings, clock):
    from holder.ledger import LedgerLocked

    started(settings, clock)
    with pytest.raises(LedgerLocked):
        MemoryHolder(settings, clock).open()


@pytest.mark.parametrize("ttl, interval", [(0.5, 0.2), (3.5, 1.0), (2.5, 1.5)])
def test_leases_outside_the_one_to_three_second_band_are_refused(tmp_path, model_dir, ttl, interval):
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        HolderSettings(model=model_dir, state_dir=tmp_path, lease_ttl=ttl, heartbeat_interval=interval)
