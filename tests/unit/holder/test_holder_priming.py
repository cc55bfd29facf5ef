"""A primed standby's priming (engine/standby.py `prime`): it maps and self-tests the holder's weights, and takes nothing.

Promise tested: before activation a primed standby holds no tenancy and no
lease at the holder — the holder's ledger gains no record, its tenant list
stays empty — and no boot generation (priming has no state directory to
take one from). And the check its engine makes at activation
(`PrimedWeights.mismatch`): the primed views serve only the region the
holder still describes; any other holder boot, region, file or model is a
miss with a reason. The holder runs in process (its ASGI app through a
TestClient), over temp files; the processes are tests/e2e/holder/test_holder_primed_standby.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from contract.holder import AttachResponse
from engine.model import load_weights
from engine.settings import EngineSettings
from engine.standby import prime
from holder.app import create_app
from holder.ledger import read_records
from holder.service import LEDGER_FILE
from holder.settings import HolderSettings
from lifeline.processes import built_model

URL = "http://holder.test"


@pytest.fixture
def model() -> Path:
    return built_model("tiny", 0)


@pytest.fixture
def holder(tmp_path: Path, model: Path) -> Iterator[TestClient]:
    settings = HolderSettings(model=model, state_dir=tmp_path / "state", shm_dir=tmp_path / "shm",
                              lease_ttl=timedelta(seconds=2.5), heartbeat_interval=timedelta(seconds=1))
    with TestClient(create_app(settings), base_url=URL) as client:
        yield client


def ledger_ops(tmp_path: Path) -> list[str]:
    return [record["op"] for record in read_records((tmp_path / "state" / LEDGER_FILE).read_bytes())[0]]


def attach(holder: TestClient, generation: int = 1) -> AttachResponse:
    response = holder.post("/v1/tenants/attach", json={"tenant_id": "engine-a", "generation": generation})
    response.raise_for_status()
    return AttachResponse.model_validate_json(response.content)


def test_a_primed_standby_holds_no_tenancy_no_lease_and_no_boot_generation(holder, model, tmp_path):
    before = ledger_ops(tmp_path)
    entries_before = set(os.listdir(tmp_path))

    primed = prime(URL, model, "float64", client=holder)

    assert ledger_ops(tmp_path) == before  # nothing written ahead: no attach, no lease, no reservation
    assert holder.get("/v1/tenants").json() == []
    assert set(os.listdir(tmp_path)) == entries_before  # no state directory, no generation file
    assert len(primed.self_test_tokens) == 2  # the self-test ran through a scheduler over the mapped views
    on_disk = load_weights(model)
    assert set(primed.model.w) == set(on_disk)
    assert all(torch.equal(primed.model.w[name], on_disk[name].to(torch.float64)) for name in on_disk)


def test_the_primed_views_serve_only_the_region_the_holder_still_describes(holder, model, tmp_path):
    primed = prime(URL, model, "float64", client=holder)
    attached = attach(holder)
    serving = EngineSettings(model=model, holder=URL, dtype="float64")
    assert primed.mismatch(serving, attached) is None

    region = attached.weights.region
    restarted = attached.model_copy(update={"holder_epoch": attached.holder_epoch + 1})
    replaced = attached.model_copy(update={"weights": attached.weights.model_copy(
        update={"region": region.model_copy(update={"region_id": region.region_id + 1})})})
    misses = {
        "holder restarted": primed.mismatch(serving, restarted),
        "region changed": primed.mismatch(serving, replaced),
        "other holder": primed.mismatch(serving.model_copy(update={"holder": "http://other.test"}), attached),
        "other dtype": primed.mismatch(serving.model_copy(update={"dtype": "float32"}), attached),
    }
    assert "the holder restarted since priming" in misses["holder restarted"]
    assert "region changed since priming" in misses["region changed"]
    assert "primed from holder" in misses["other holder"]
    assert "in float64, serving" in misses["other dtype"]

    # The same description over another file (the region file rewritten under the same name): a miss too.
    path = Path(region.path)
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data)
    assert "was replaced since priming" in primed.mismatch(serving, attached)
