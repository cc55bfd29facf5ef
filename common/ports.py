"""A free loopback port for a process about to be started, outside the kernel's ephemeral range.

Binding port 0 hands out an *ephemeral* port, the same range the kernel picks
client source ports from: on a busy machine (a test suite opens thousands of
connections) the port can be taken by some outgoing connection between the
check and the child's own bind, and Redis/Sentinel/BIND then die with
"Address already in use". Ports below the ephemeral range are never given to
clients, so a port checked free there stays free unless another starter takes
it; this process never hands the same one out twice.

Starters in several processes at once (the test suite's parallel workers)
are kept apart by `LIFELINE_PORT_SLICE=i/n`: this process and its children
pick only from the i-th of n equal slices of the range.
"""

from __future__ import annotations

import os
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


def port_range() -> tuple[int, int]:
    """The ports this process may hand out (inclusive): below the ephemeral range, within its slice if it has one."""
    lowest, highest = _LOWEST, _ephemeral_start() - 1
    slice_ = os.environ.get("LIFELINE_PORT_SLICE")
    if not slice_:
        return lowest, highest
    try:
        index, count = (int(part) for part in slice_.split("/"))
    except ValueError:
        raise ValueError(f"LIFELINE_PORT_SLICE={slice_!r}: expected i/n, e.g. 0/3") from None
    if not 0 <= index < count:
        raise ValueError(f"LIFELINE_PORT_SLICE={slice_!r}: i must be in 0..n-1")
    width = (highest - lowest + 1) // count
    return lowest + index * width, lowest + (index + 1) * width - 1


def free_port() -> int:
    """A loopback port (TCP and UDP) nothing listens on now, below the ephemeral range (racy only against other starters)."""
    lowest, highest = port_range()
    with _lock:
        for _ in range(200):
            port = random.randint(lowest, highest)  # noqa: S311 - spreads starters apart, not a secret
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    raise OSError(f"no free loopback port in {lowest}..{highest}")
