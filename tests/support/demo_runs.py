"""What the demo tests share: the environment a user's shell gives `lifeline demo`, and what it left running."""

from __future__ import annotations

import os
from pathlib import Path

# A wide terminal (rich wraps nothing the tests match) and a plain PATH with the system's daemons.
ENV = {"COLUMNS": "400", "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}


def left_running(workdir: Path) -> list[str]:
    """Processes whose argv or environment names the work dir: whatever the demo started and did not stop."""
    left = []
    needle = str(workdir).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in argv or needle in environ:
            shown = argv.replace(b"\0", b" ").decode(errors="replace")[:200]
            left.append(f"{entry.name}: {shown}")
    return left
