"""The anycast tier: a zone announces the region's service prefix over BGP, or stops.

Zone faults are cut over here (seconds). Every zone's ExaBGP speaker
announces the same prefix with its own next hop; routers pick one path. A
zone is taken out by withdrawing its announcement and brought back by
announcing it again; the other zones' paths take over at the routers.

- Writes go to the zone's ExaBGP through its process API (`ExaBgpApi`: a
  command FIFO read by `cutover.drivers.exabgp_bridge`, which ExaBGP runs as
  its API process, and an ack FIFO with ExaBGP's `done` / `error`).
  Announce and withdraw are idempotent, so an unreachable speaker is
  retried; an `error` ack is a refusal.
- Reads come from an observing router, not from the speaker: the state is
  whether the router holds a path for the prefix with the zone's next hop
  (`BirdRouteReader`: `birdc show route <prefix> all` on BIRD 2). The
  evidence names every path the router has and which one is best, so a
  withdrawal verifies as "gone, the other zone's path best".

Measured on loopback (BIRD 2.0.12, ExaBGP 5.0.15 through its API): announce → visible at BIRD and
withdraw → gone in 2–3 ms; the "seconds" a zone cutover is given are the
routers beyond the first hop and their damping, not this write.
"""

from __future__ import annotations

import errno
import os
import re
import select
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from common.clock import Clock
from contract.routing_tier import RoutingTier
from cutover.drivers.base import AnycastState, AnycastTarget, DriverRejected, DriverUnavailable
from cutover.drivers.polling import PollingDriver, retry_unavailable


class ExaBgpApi:
    """One ExaBGP speaker's API: write a command line, read its `done` / `error` ack."""

    def __init__(self, command_fifo: Path | str, ack_fifo: Path | str, *, ack_timeout_s: float = 2.0) -> None:
        self.command_fifo = Path(command_fifo)
        self.ack_fifo = Path(ack_fifo)
        self.ack_timeout_s = ack_timeout_s
        self._lock = threading.Lock()  # one command in flight, so acks pair with commands

    def send(self, command: str) -> None:
        with self._lock:
            try:
                ack_fd = os.open(self.ack_fifo, os.O_RDONLY | os.O_NONBLOCK)
            except FileNotFoundError as exc:
                raise DriverUnavailable(f"exabgp ack FIFO {self.ack_fifo} is missing") from exc
            try:
                self._drain(ack_fd)  # an ack whose command timed out must not answer this one
                try:
                    command_fd = os.open(self.command_fifo, os.O_WRONLY | os.O_NONBLOCK)
                except OSError as exc:  # ENXIO: no reader, the bridge (and so ExaBGP) is gone
                    raise DriverUnavailable(f"exabgp at {self.command_fifo} is not running: {exc.strerror}") from exc
                try:
                    os.write(command_fd, command.encode() + b"\n")
                finally:
                    os.close(command_fd)
                ack = self._read_ack(ack_fd)
            finally:
                os.close(ack_fd)
        if ack != "done":
            raise DriverRejected(f"exabgp refused {command!r}: {ack}")

    @staticmethod
    def _drain(fd: int) -> None:
        while select.select([fd], [], [], 0)[0]:
            try:
                if not os.read(fd, 65536):
                    return
            except BlockingIOError:
                return

    def _read_ack(self, fd: int) -> str:
        deadline = time.monotonic() + self.ack_timeout_s
        buffered = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DriverUnavailable(f"exabgp sent no ack within {self.ack_timeout_s:g}s")
            if not select.select([fd], [], [], left)[0]:
                continue
            try:
                chunk = os.read(fd, 4096)
            except BlockingIOError:
                continue
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise DriverUnavailable(f"exabgp ack FIFO: {exc}") from exc
            buffered += chunk
            for line in buffered.decode(errors="replace").splitlines():
                if line.strip() in ("done", "error"):
                    return line.strip()
            if not chunk:
                time.sleep(0.001)  # no writer right now (EOF on a non-blocking FIFO); bounded by deadline


@dataclass(frozen=True)
class BgpPath:
    next_hop: str
    best: bool
    learned_from: str  # the BGP protocol (session) it came from


_PATH_HEAD = re.compile(r"^(?:\S+\s+)?unicast \[(?P<proto>\S+) .*?\](?P<best> \*)?")
_NEXT_HOP = re.compile(r"BGP\.next_hop:\s*(?P<nh>\S+)")


class BirdRouteReader:
    """An observing BIRD 2 router's table, read through `birdc` on its control socket."""

    def __init__(self, socket_path: Path | str, *, birdc: str = "birdc", timeout_s: float = 5.0) -> None:
        self.socket_path = str(socket_path)
        self.birdc = birdc
        self.timeout_s = timeout_s

    def paths(self, prefix: str) -> tuple[list[BgpPath], str]:
        try:
            done = subprocess.run([self.birdc, "-s", self.socket_path, "show", "route", prefix, "all"],
                                  capture_output=True, text=True, timeout=self.timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DriverUnavailable(f"birdc on {self.socket_path}: {exc}") from exc
        output = done.stdout + done.stderr
        if done.returncode != 0 or "Unable to connect" in output:
            raise DriverUnavailable(f"birdc on {self.socket_path}: {output.strip()[-300:]}")
        paths: list[BgpPath] = []
        head: re.Match[str] | None = None
        for line in output.splitlines():
            if match := _PATH_HEAD.match(line.strip()):
                head = match
            elif head is not None and (nh := _NEXT_HOP.search(line)):
                paths.append(BgpPath(next_hop=nh["nh"], best=bool(head["best"]), learned_from=head["proto"]))
                head = None
        return paths, output


class AnycastDriver(PollingDriver[AnycastState]):
    """Announce / withdraw a zone's path through its ExaBGP; verify at the observing router."""

    tier = RoutingTier.ANYCAST

    def __init__(self, *, speakers: Mapping[str, ExaBgpApi], observer: BirdRouteReader,
                 clock: Clock | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__(clock=clock, sleep=sleep)
        self.speakers = dict(speakers)
        self.observer = observer

    @retry_unavailable()
    def observe(self, target: AnycastTarget) -> tuple[AnycastState, str]:  # type: ignore[override]
        paths, _ = self.observer.paths(target.prefix)
        announced = any(p.next_hop == target.next_hop for p in paths)
        best = next((p for p in paths if p.best), None)
        listed = ", ".join(f"{p.next_hop} from {p.learned_from}{' (best)' if p.best else ''}" for p in paths)
        evidence = (f"router has {len(paths)} path(s) for {target.prefix}: {listed or 'none'}; "
                    f"{target.zone}'s path via {target.next_hop} {'present' if announced else 'gone'}; "
                    f"best via {best.next_hop if best else 'nothing'}")
        return AnycastState(target=target, announced=announced), evidence

    def best_next_hop(self, prefix: str) -> str | None:
        paths, _ = self.observer.paths(prefix)
        return next((p.next_hop for p in paths if p.best), None)

    @retry_unavailable()
    def _write(self, desired: AnycastState) -> None:  # type: ignore[override]
        target = desired.target
        speaker = self.speakers.get(target.zone)
        if speaker is None:
            raise DriverRejected(f"no ExaBGP speaker configured for zone {target.zone}")
        verb = "announce" if desired.announced else "withdraw"
        speaker.send(f"{verb} route {target.prefix} next-hop {target.next_hop}")
