"""The memory holder on a GPU: weights held in device memory, tenants open them through CUDA IPC.

Promises tested (service recovery, miss never misuse), on real processes:
a holder started with `--device cuda:0` uploads its sealed region once and
exports the allocation's IPC handle; a tenant process attaches, opens it
(`engine.holder_client.map_device_weights`) and gets one view per weight,
all in the holder's allocation (nothing copied), equal byte for byte to the
region file; a tenant SIGKILLed and restarted under generation + 1 takes
over and opens the same allocation; a SIGKILLed holder comes back adopting
its region file (checked against its seal, no shard read) and uploads again,
and tenants open the new handle. The ledger and leases are the CPU path's.

Skipped only when no CUDA device is present (the one accepted skip; the
driver is asked, `tests.support.gpu`); on a GPU machine whose torch is the
CPU wheel `.venv` pins, it fails naming how to run it under a CUDA torch. The
parts that need no device (the setting, the handle records, the refusals)
are tests/unit/holder/test_holder_device.py.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from holder.process import HolderProcess
from lifeline.processes import built_model, free_port
from tests.support.gpu import cuda_device_present

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda_device_present(), reason="needs a CUDA device: the holder's CUDA IPC path (the CPU side is tests/unit/holder/test_holder_device.py)")]

# The holder runs under this interpreter (holder.process: sys.executable), so its torch must have CUDA.
CUDA_TORCH_HOWTO = ("python3 -m venv .lifeline/tools/holder-cuda && .lifeline/tools/holder-cuda/bin/pip install "
                    "torch -e '.[engine,dev]' && .lifeline/tools/holder-cuda/bin/python -m pytest -m gpu "
                    "tests/gpu/test_holder_cuda_ipc.py")


@pytest.fixture(autouse=True, scope="module")
def _cuda_torch() -> None:
    """A GPU machine whose torch is the CPU wheel fails here, loudly, instead of skipping."""
    import torch

    if not torch.cuda.is_available():
        pytest.fail(f"a CUDA device is present, but this interpreter's torch {torch.__version__} has no CUDA "
                    f"(.venv pins the CPU wheel); run this test under a CUDA torch: {CUDA_TORCH_HOWTO}")


ROOT = Path(__file__).resolve().parents[2]

# A tenant process: attach, open the device copy, check it against the region file, keep the lease or exit.
TENANT = r"""
import json, os, sys, time
import torch
from engine.holder_client import HolderTenancy, attach, map_device_weights, map_weights

url, tenant_id, generation, hold = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "hold"
response = attach(url, tenant_id, generation)
description = response.weights
device_weights = map_device_weights(description, "cuda:0")
host_weights = map_weights(description)
copy = description.device_copy
storage = next(iter(device_weights.values())).untyped_storage()
base = storage.data_ptr()
same_storage = all(w.untyped_storage().data_ptr() == base for w in device_weights.values())
inside = all(base <= w.data_ptr() and w.data_ptr() + w.nbytes <= base + copy.size for w in device_weights.values())
offsets = all(device_weights[s.name].data_ptr() - base == s.offset for s in description.region.tensors)
equal = all(torch.equal(device_weights[n].cpu(), host_weights[n]) for n in host_weights)
name = sorted(device_weights)[0]
w = device_weights[name].reshape(device_weights[name].shape[0], -1)
h = host_weights[name].reshape(w.shape[0], -1)
computes = torch.allclose((w @ w.T).cpu(), h @ h.T, rtol=1e-3, atol=1e-3)  # device vs CPU summation order
tenancy = HolderTenancy(url, tenant_id, generation, response.heartbeat_interval_s)
tenancy.confirm()
print(json.dumps({"device": copy.device, "region_id": description.region.region_id,
                  "holder_epoch": response.holder_epoch, "takeover": response.takeover,
                  "tensors": len(device_weights), "same_storage": same_storage, "inside": inside,
                  "offsets": offsets, "equal": equal, "computes": computes,
                  "storage_bytes": storage.nbytes()}), flush=True)
if hold:
    tenancy.start()
    time.sleep(3600)
"""


class Tenant:
    def __init__(self, url: str, tenant_id: str, generation: int, *, hold: bool) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", TENANT, url, tenant_id, str(generation),
                                         "hold" if hold else "exit"], cwd=ROOT, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)

    def report(self, timeout: float = 180) -> dict[str, Any]:
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if line.startswith("{"):
                return json.loads(line)
            if not line and self.process.poll() is not None:
                break
        self.process.kill()
        raise AssertionError(f"tenant gave no report: {self.process.stderr.read() if self.process.stderr else ''}")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)


@pytest.fixture
def cuda_holder(tmp_path: Path) -> Iterator[HolderProcess]:
    shm = Path("/dev/shm") / f"lifeline-gpu-test-{time.monotonic_ns()}"
    holder = HolderProcess(built_model("tiny", 0), free_port(), tmp_path / "holder-state", shm,
                           tmp_path / "holder.log", ["--device", "cuda:0", "--dtype", "float32"])
    holder.start()
    holder.wait_ready(timeout=300)
    yield holder
    holder.kill()
    shutil.rmtree(shm, ignore_errors=True)


def assert_views_of_the_holders_allocation(report: dict[str, Any]) -> None:
    assert report["device"] == "cuda:0"
    assert report["tensors"] > 0
    assert report["same_storage"] and report["inside"] and report["offsets"]  # views, not copies
    assert report["equal"] and report["computes"]  # the region file's bytes, usable on the device


def test_a_tenant_opens_the_holders_device_weights_without_copying_and_takes_over_after_a_sigkill(cuda_holder):
    first = Tenant(cuda_holder.url, "gpu-engine", 1, hold=True)
    report = first.report()
    assert_views_of_the_holders_allocation(report)
    assert report["takeover"] is False
    assert "weights copied to the device" in cuda_holder.logs()

    first.kill()  # the tenant dies; the holder's allocation does not
    second = Tenant(cuda_holder.url, "gpu-engine", 2, hold=False)
    again = second.report()
    second.process.wait(timeout=60)
    assert_views_of_the_holders_allocation(again)
    assert again["takeover"] is True
    assert (again["region_id"], again["storage_bytes"]) == (report["region_id"], report["storage_bytes"])
    tenant = cuda_holder.tenant("gpu-engine")
    assert (tenant["generation"], tenant["state"], tenant["takeovers"]) == (2, "attached", 1)


def test_a_sigkilled_cuda_holder_adopts_its_region_and_uploads_it_again(cuda_holder):
    before = Tenant(cuda_holder.url, "gpu-engine", 1, hold=False)
    report = before.report()
    before.process.wait(timeout=60)

    cuda_holder.kill(signal.SIGKILL)  # its device memory goes with it; the region file stays
    cuda_holder.start()
    cuda_holder.wait_ready(timeout=300)
    assert "weights region adopted" in cuda_holder.logs()
    assert cuda_holder.logs().count("weights copied to the device") == 2

    after = Tenant(cuda_holder.url, "gpu-engine", 2, hold=False)
    again = after.report()
    after.process.wait(timeout=60)
    assert_views_of_the_holders_allocation(again)
    assert again["region_id"] == report["region_id"]
    assert again["holder_epoch"] == report["holder_epoch"] + 1
