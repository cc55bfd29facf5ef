"""The holder's weights on a CUDA device, exported to tenants through CUDA IPC (`device: cuda[:N]`).

The region file in /dev/shm stays the durable copy the ledger describes; with
a CUDA device the holder also uploads it once into one device allocation of
the same size and layout and exports that allocation's IPC handle
(`UntypedStorage._share_cuda_`, what torch.multiprocessing sends between
processes). A tenant opens it (`engine/holder_client.py`, `map_device_weights`)
and builds one view per tensor at the region's offsets: the same phases as on
CPU, with a handle where the file path was.

    reserve/seal   unchanged (the region file, fsynced ledger records)
    device copy    torch.empty(size, uint8, cuda) ← region file; sealed checksum carried
    attach         WeightsDescription.device_copy: device, size, IPC handle
    holder dies    the device allocation dies with it (CUDA frees a dead process's
                   memory); the restarted holder adopts the region file and uploads again

Why one allocation for all weights: one IPC handle to open (each
`cudaIpcOpenMemHandle` maps a whole allocation), and the tenant's views
are plain offsets, as on CPU. torch is imported only when a device is asked
for: a CPU holder never needs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from common.logs import get_logger
from contract.holder import CudaIpcHandle, DeviceCopy

log = get_logger(__name__)


class DeviceUnavailable(Exception):
    """The configured device cannot hold the weights; `str()` names the setting."""


class DeviceMirror:
    """One device allocation holding a sealed region's bytes, alive as long as the holder process."""

    def __init__(self, device: str) -> None:
        try:
            import torch
        except ImportError:
            raise DeviceUnavailable(f"device={device} (LIFELINE_HOLDER_DEVICE) needs torch with CUDA; "
                                    "torch is not installed") from None
        if not torch.cuda.is_available():
            raise DeviceUnavailable(f"device={device} (LIFELINE_HOLDER_DEVICE) but torch sees no CUDA device")
        index = torch.device(device).index or 0
        if index >= torch.cuda.device_count():
            raise DeviceUnavailable(f"device={device} (LIFELINE_HOLDER_DEVICE) but only "
                                    f"{torch.cuda.device_count()} CUDA device(s) are visible")
        self.device = f"cuda:{index}"
        self._torch = torch
        self.buffer: Any = None  # torch.Tensor, uint8, on the device; kept referenced: the export's lifetime

    def upload(self, path: Path, size: int, region_checksum: str) -> DeviceCopy:
        """Copy the region file onto the device once and export the allocation."""
        torch = self._torch
        host = np.memmap(path, dtype=np.uint8, mode="c", shape=(size,))  # copy-on-write: never written
        self.buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
        self.buffer.copy_(torch.from_numpy(host))
        torch.cuda.synchronize(self.device)
        del host
        handle = CudaIpcHandle.from_share_args(self.buffer.untyped_storage()._share_cuda_())
        log.info("weights copied to the device", device=self.device, bytes=size)
        return DeviceCopy(device=self.device, size=size, region_checksum=region_checksum, ipc=handle)
