"""Whether this machine has a CUDA device: the one condition the `gpu` tests may skip on.

Asked of the driver (`nvidia-smi -L`), not only of this interpreter's torch: `.venv` pins the CPU
torch wheel, and a GPU machine must not skip a GPU test because of it.
"""

from __future__ import annotations

import shutil
import subprocess


def cuda_device_present() -> bool:
    try:
        import torch

        if torch.cuda.is_available():
            return True
    except ImportError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    return listing.returncode == 0 and "GPU" in listing.stdout
