"""The boot generation: a counter that grows on every start of one instance id.

Kept in the engine's state directory so a restarted process is always newer
than the one it replaces; anything stamped with an older generation (a late
frame, a lease renewal) can then be told apart and rejected. When the engine
registers with a lease registry, the registry's generation supersedes this.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


def next_boot_generation(state_dir: Path) -> int:
    """Increment and return the stored generation, atomically across processes."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "generation"
    with open(state_dir / "generation.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            current = int(path.read_text().strip()) if path.exists() else 0
        except ValueError as exc:
            raise RuntimeError(f"corrupt generation file {path}: {exc}") from exc
        generation = current + 1
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{generation}\n")
        with open(tmp) as handle:
            os.fsync(handle.fileno())
        tmp.replace(path)
        return generation
