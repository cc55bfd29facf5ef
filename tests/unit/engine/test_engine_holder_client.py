"""The engine's side of the holder: views over the region file, never copies; refusals are misses."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from common.clock import ManualClock
from engine.holder_client import HolderUnavailable, check_compatible, map_weights
from holder.service import MemoryHolder
from holder.settings import HolderSettings


@pytest.fixture
def held(tmp_path: Path):
    model = tmp_path / "model"
    model.mkdir()
    save_file({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, str(model / "model-00001-of-00001.safetensors"))
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "model-00001-of-00001.safetensors"}}))
    (model / "config.json").write_text("{}")
    holder = MemoryHolder(HolderSettings(model=model, state_dir=tmp_path / "state", shm_dir=tmp_path / "shm",
                                         lease_ttl=timedelta(seconds=2), heartbeat_interval=timedelta(seconds=1)),
                          ManualClock())
    holder.open()
    return model, holder.ensure_weights()


def test_tensors_are_views_of_the_holders_pages(held):
    _, description = held
    weights = map_weights(description)
    assert weights["w"].dtype == torch.float64
    assert weights["w"].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    spec = description.region.tensors[0]
    with open(description.region.path, "r+b") as region:  # the holder's bytes change: the view sees it
        region.seek(spec.offset)
        region.write(np.array([42.0], dtype=np.float64).tobytes())
    assert weights["w"][0, 0].item() == 42.0


def test_a_tenant_writing_into_a_weight_does_not_touch_the_holders_copy(held):
    _, description = held
    weights = map_weights(description)
    weights["w"][1, 2] = -7.0
    assert map_weights(description)["w"][1, 2].item() == 5.0


def test_weights_for_another_config_or_dtype_are_refused(held, tmp_path):
    model, description = held
    check_compatible(description, model, torch.float64)
    with pytest.raises(HolderUnavailable, match="float64 weights; this engine computes in float32"):
        check_compatible(description, model, torch.float32)
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text('{"hidden_size": 8}')
    with pytest.raises(HolderUnavailable, match="another config.json"):
        check_compatible(description, other, torch.float64)


def test_a_region_file_that_is_gone_is_a_miss(held):
    _, description = held
    Path(description.region.path).unlink()
    with pytest.raises(HolderUnavailable, match="cannot map region 1"):
        map_weights(description)
