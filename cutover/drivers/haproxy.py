"""The l7 tier on HAProxy: drain, maintain or re-weight one server through the runtime API.

Instance faults are cut over here (milliseconds). `drain` stops new
connections and requests to the server while the ones it has run to their
end (a streaming completion finishes); `maint` stops it outright; `ready`
puts it back; the weight shifts a share of new traffic.

The runtime API is a text protocol on the admin socket (`stats socket …
level admin`, TCP or a UNIX path): one connection per command batch,
commands separated by `;`, the answer read to EOF. Writes are
`set weight B/S W` and `set server B/S state ready|drain|maint` in one
batch (idempotent: retried when the socket is unreachable; any answer
text, e.g. "No such server.", is a refusal). Reads are `show servers state
B`, whose `srv_admin_state` is a bit field: 0x01/0x02/0x04/0x20/0x40 are
the maintenance flags (forced, inherited, config, resolution, health),
0x08/0x10 drain (forced, inherited); `srv_uweight` is the weight set.
Measured on HAProxy 2.6 on loopback: the write is in effect on the next
read (the API answers after applying it).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

from common.clock import Clock
from contract.routing_tier import RoutingTier
from cutover.drivers.base import DriverRejected, DriverUnavailable, L7AdminState, L7State, L7Target
from cutover.drivers.polling import PollingDriver, retry_unavailable

_MAINT_FLAGS = 0x01 | 0x02 | 0x04 | 0x20 | 0x40
_DRAIN_FLAGS = 0x08 | 0x10


def admin_state_from_flags(flags: int) -> L7AdminState:
    if flags & _MAINT_FLAGS:
        return "maint"
    if flags & _DRAIN_FLAGS:
        return "drain"
    return "ready"


class HaproxyRuntimeApi:
    """HAProxy's runtime API on a TCP address ('127.0.0.1', 9999) or a UNIX socket path."""

    def __init__(self, address: tuple[str, int] | Path | str, *, timeout_s: float = 2.0) -> None:
        self.address = address
        self.timeout_s = timeout_s

    def run(self, commands: str) -> str:
        family = socket.AF_INET if isinstance(self.address, tuple) else socket.AF_UNIX
        target = self.address if isinstance(self.address, tuple) else str(self.address)
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.settimeout(self.timeout_s)
                sock.connect(target)
                sock.sendall(commands.encode() + b"\n")
                chunks = []
                while chunk := sock.recv(65536):
                    chunks.append(chunk)
        except OSError as exc:
            raise DriverUnavailable(f"haproxy runtime API at {target}: {exc!r}") from exc
        return b"".join(chunks).decode(errors="replace")


class HaproxyDriver(PollingDriver[L7State]):
    tier = RoutingTier.L7

    def __init__(self, api: HaproxyRuntimeApi, *, clock: Clock | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__(clock=clock, sleep=sleep)
        self.api = api

    @retry_unavailable()
    def observe(self, target: L7Target) -> tuple[L7State, str]:  # type: ignore[override]
        answer = self.api.run(f"show servers state {target.backend}")
        header: list[str] | None = None
        for line in answer.splitlines():
            if line.startswith("# "):
                header = line[2:].split()
                continue
            fields = line.split()
            if header is None or len(fields) < len(header) - 1:
                continue
            row = dict(zip(header, fields, strict=False))
            if row.get("be_name") == target.backend and row.get("srv_name") == target.server:
                state = L7State(target=target, admin_state=admin_state_from_flags(int(row["srv_admin_state"])),
                                weight=int(row["srv_uweight"]))
                evidence = (f"{target.backend}/{target.server} srv_op_state={row['srv_op_state']} "
                            f"srv_admin_state={row['srv_admin_state']} srv_uweight={row['srv_uweight']} "
                            f"srv_iweight={row['srv_iweight']}")
                return state, evidence
        raise DriverRejected(f"haproxy has no server {target.backend}/{target.server}: {answer.strip()[:300]}")

    @retry_unavailable()
    def _write(self, desired: L7State) -> None:  # type: ignore[override]
        name = f"{desired.target.backend}/{desired.target.server}"
        answer = self.api.run(f"set weight {name} {desired.weight}; set server {name} state {desired.admin_state}")
        if answer.strip():
            raise DriverRejected(f"haproxy refused the change to {name}: {answer.strip()[:300]}")

    def current_sessions(self, target: L7Target) -> int:
        """Connections the server has open now (`show stat` scur): what a drain lets finish."""
        answer = self.api.run("show stat")
        lines = answer.splitlines()
        header = lines[0].lstrip("# ").split(",") if lines else []
        for line in lines[1:]:
            row = dict(zip(header, line.split(","), strict=False))
            if row.get("pxname") == target.backend and row.get("svname") == target.server:
                return int(row["scur"] or 0)
        raise DriverRejected(f"haproxy has no server {target.backend}/{target.server} in show stat")
