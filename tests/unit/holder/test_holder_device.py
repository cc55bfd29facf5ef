"""The CUDA IPC path's parts that need no device: the setting, the handle records, the refusals.

The path itself (the holder uploads and exports, a tenant process opens and
views without copying) is tests/gpu/test_holder_cuda_ipc.py, marked `gpu`.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from safetensors.numpy import save_file

from common.clock import ManualClock
from contract.holder import CudaIpcHandle, DeviceCopy, WeightsDescription, normalize_device
from engine.holder_client import HolderUnavailable, map_device_weights
from holder.device import DeviceUnavailable
from holder.service import MemoryHolder
from holder.settings import HolderSettings

# The shape of torch's UntypedStorage._share_cuda_() result: device, handle, size, offset,
# ref-counter file name, ref-counter offset, event handle (or None), whether to sync on it.
SHARE_ARGS = (1, bytes(range(64)), 4096, 0, b"/torch_1234_5678_0", 3, b"\x00\xff" * 32, True)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    save_file({"a.weight": np.arange(12, dtype=np.float32).reshape(3, 4)}, str(model / "model-00001-of-00001.safetensors"))
    (model / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {"a.weight": "model-00001-of-00001.safetensors"}}))
    (model / "config.json").write_text(json.dumps({"hidden_size": 4}))
    return model


def settings_for(tmp_path: Path, model_dir: Path, **overrides) -> HolderSettings:
    return HolderSettings(model=model_dir, state_dir=tmp_path / "state", shm_dir=tmp_path / "shm",
                          lease_ttl=timedelta(seconds=2.5), heartbeat_interval=timedelta(seconds=1), **overrides)


@pytest.mark.parametrize(("given", "held"), [("cpu", "cpu"), ("cuda", "cuda:0"), ("cuda:0", "cuda:0"), ("cuda:3", "cuda:3")])
def test_the_device_setting_accepts_cpu_and_cuda_devices(tmp_path, model_dir, given, held):
    assert settings_for(tmp_path, model_dir, device=given).device == held


@pytest.mark.parametrize("given", ["gpu", "cuda:", "cuda:x", "CUDA", "mps", "cuda:0 ", ""])
def test_a_device_setting_that_names_no_device_stops_start_up_naming_the_key(tmp_path, model_dir, given):
    with pytest.raises(ValidationError, match="device"):
        settings_for(tmp_path, model_dir, device=given)


def test_the_default_device_is_cpu(tmp_path, model_dir):
    assert settings_for(tmp_path, model_dir).device == "cpu"
    with pytest.raises(ValueError, match="not 'cpu'"):
        normalize_device("tpu")


@pytest.mark.parametrize("event_handle", [SHARE_ARGS[6], None])
def test_an_ipc_handle_record_gives_back_the_exact_share_tuple_over_json(event_handle):
    args = (*SHARE_ARGS[:6], event_handle, event_handle is not None)
    record = CudaIpcHandle.from_share_args(args)
    wire = record.model_dump_json()
    assert CudaIpcHandle.model_validate_json(wire).share_args() == args
    assert all(isinstance(v, bytes) for v in CudaIpcHandle.model_validate_json(wire).share_args()[1:5:3])


def test_an_ipc_handle_that_is_not_base64_is_refused_when_opened():
    record = CudaIpcHandle.from_share_args(SHARE_ARGS).model_copy(update={"handle": "not base64!"})
    with pytest.raises(ValueError):
        record.share_args()


def description_with(tmp_path, model_dir, copy: DeviceCopy | None) -> WeightsDescription:
    holder = MemoryHolder(settings_for(tmp_path, model_dir), ManualClock())
    holder.open()
    weights = holder.ensure_weights()
    holder.close(clean=False)
    return weights.model_copy(update={"device_copy": copy})


def test_a_weights_description_with_a_device_copy_round_trips(tmp_path, model_dir):
    plain = description_with(tmp_path, model_dir, None)
    copy = DeviceCopy(device="cuda:0", size=plain.region.size, region_checksum=plain.region.checksum,
                      ipc=CudaIpcHandle.from_share_args(SHARE_ARGS))
    described = plain.model_copy(update={"device_copy": copy})
    assert WeightsDescription.model_validate_json(described.model_dump_json()) == described
    assert WeightsDescription.model_validate_json(plain.model_dump_json()).device_copy is None


def test_a_cpu_holder_keeps_no_device_copy(tmp_path, model_dir):
    holder = MemoryHolder(settings_for(tmp_path, model_dir), ManualClock())
    holder.open()
    holder.ensure_weights()
    assert holder.ensure_device_copy().device_copy is None
    holder.close(clean=True)


def test_a_cuda_holder_without_a_device_stops_naming_the_setting(tmp_path, model_dir, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    holder = MemoryHolder(settings_for(tmp_path, model_dir, device="cuda"), ManualClock())
    holder.open()
    holder.ensure_weights()
    with pytest.raises(DeviceUnavailable, match="LIFELINE_HOLDER_DEVICE"):
        holder.ensure_device_copy()
    holder.close(clean=True)


def test_a_tenant_refuses_device_weights_the_holder_does_not_hold_or_holds_elsewhere(tmp_path, model_dir, monkeypatch):
    plain = description_with(tmp_path, model_dir, None)
    with pytest.raises(HolderUnavailable, match="no device copy"):
        map_device_weights(plain, "cuda:0")
    copy = DeviceCopy(device="cuda:1", size=plain.region.size, region_checksum=plain.region.checksum,
                      ipc=CudaIpcHandle.from_share_args(SHARE_ARGS))
    with pytest.raises(HolderUnavailable, match="on cuda:1"):
        map_device_weights(plain.model_copy(update={"device_copy": copy}), "cuda:0")
    stale = copy.model_copy(update={"device": "cuda:0", "region_checksum": "sha256:" + "0" * 64})
    with pytest.raises(HolderUnavailable, match="does not match"):
        map_device_weights(plain.model_copy(update={"device_copy": stale}), "cuda:0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(HolderUnavailable, match="sees no CUDA device"):
        map_device_weights(plain.model_copy(update={"device_copy": copy.model_copy(update={"device": "cuda:0"})}),
                           "cuda:0")
