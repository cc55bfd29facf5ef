"""A free loopback port for a process about to be started, outside the kernel's ephemeral range.

Binding port 0 hands out an *ephemeral* port, the same range the kernel picks
client source ports from: on a busy machine (a test suite opens thousands of
connections) the port can be taken by some outgoing connection between the
check and the child's own bind, and Redis/Sentinel/BIND then die with
"Address already in use". Ports below the ephemeral range are never given to
clients, so a port checked free there stays free unless another starter takes
it; this process never hands the same one out twice.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 20000  # above the well-known and most registered service ports
_handed_out: set[int] = set()
_lock = threading.Lock()


def _ephemeral_start() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(port: int) -> bool:
    """Free for TCP and UDP both (BIND9 listens on both with one number)."""
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(socket.AF_INET, kind) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def free_port() -> int:
    """A loopback port (TCP and UDP) nothing listens on now, below the ephemeral range (racy only against other starters)."""
    highest = _ephemeral_start() - 1
    with _lock:
        for _ in range(200):
            port = random.randint(_LOWEST, highest)  # noqa: S311 - spreads starters apart, not a secret
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    raise OSError(f"no free loopback port in {_LOWEST}..{highest}")
