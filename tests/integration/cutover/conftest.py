"""Real routing daemons for the cutover driver tests (tests/support/daemons.py).

Each fixture starts its daemon in the test's temp dir on spare loopback
ports and stops it by pid at teardown; a daemon that is not installed
fails the test naming its package. (The cutover workflow's fixtures live in
test_cutover_support.py.)
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from cutover.drivers.base import EXTERNAL_TTL_S, INTERNAL_TTL_S, AnycastState, AnycastTarget, L7Target
from cutover.drivers.anycast import AnycastDriver, BirdRouteReader, ExaBgpApi
from cutover.drivers.haproxy import HaproxyDriver, HaproxyRuntimeApi
from lifeline.daemons import BgpPeer, BindServer, BirdRouter, DnsRecord, ExaBgpSpeaker, HaproxyServer

# The lab zone seeds the dual TTL's two records (`bind_server`), both answering region A: a cutover
# moves the external one, and the internal one where the target (the drivers file) names it.
REGION_A = "192.0.2.10"
REGION_B = "198.51.100.10"


def dns_drivers_table(bind: BindServer, directory: Path, *, internal: str = "") -> str:
    """The drivers file's `[dns]` table for the lab's BIND9 (eu and us fail over to each other).

    Writes the TSIG secret beside it, as an operator's secret file.
    `internal` is added to the table as it is (`internal_name = …`).
    """
    secret = directory / "tsig.secret"
    secret.write_text(bind.key_secret)
    return f"""
[dns]
zone = "{bind.zone}"
name = "api.{bind.zone}"
{internal}
[dns.rfc2136]
server = "{bind.host}"
port = {bind.port}
key_name = "{bind.key_name}"
key_secret_file = "{secret}"
[dns.regions.eu]
answer = ["{REGION_A}"]
failover_to = "us"
[dns.regions.us]
answer = ["{REGION_B}"]
failover_to = "eu"
"""


@pytest.fixture
def bind_server(tmp_path: Path) -> Iterator[BindServer]:
    server = BindServer(workdir=tmp_path / "bind", records=[
        DnsRecord("api", EXTERNAL_TTL_S, "A", REGION_A),
        DnsRecord("api.internal", INTERNAL_TTL_S, "A", REGION_A),
    ])
    try:
        yield server.start()
    finally:
        server.stop()


# ------------------------------------------------------------------ anycast

SERVICE_PREFIX = "203.0.113.10/32"


@dataclass
class AnycastLab:
    """BIRD 2 observing two zones' ExaBGP speakers, both announcing SERVICE_PREFIX."""

    router: BirdRouter
    speakers: dict[str, ExaBgpSpeaker]
    driver: AnycastDriver
    targets: dict[str, AnycastTarget]

    def new_driver(self) -> AnycastDriver:
        return AnycastDriver(
            speakers={zone: ExaBgpApi(s.command_fifo, s.ack_fifo, ack_timeout_s=1.0)
                      for zone, s in self.speakers.items()},
            observer=BirdRouteReader(self.router.socket_path))


@pytest.fixture
def anycast_lab(tmp_path: Path) -> Iterator[AnycastLab]:
    peers = {"zone-a": BgpPeer("zone_a", "127.0.0.2", 65002), "zone-b": BgpPeer("zone_b", "127.0.0.3", 65003)}
    router = BirdRouter(workdir=tmp_path / "bird", peers=list(peers.values()))
    speakers: dict[str, ExaBgpSpeaker] = {}
    try:
        router.start()
        for zone, peer in peers.items():
            speakers[zone] = ExaBgpSpeaker(workdir=tmp_path / zone, peer=peer, router=router).start()
        lab = AnycastLab(router=router, speakers=speakers, driver=None,  # type: ignore[arg-type]
                         targets={zone: AnycastTarget(prefix=SERVICE_PREFIX, zone=zone, next_hop=peer.address)
                                  for zone, peer in peers.items()})
        lab.driver = lab.new_driver()
        for target in lab.targets.values():
            lab.driver.apply(AnycastState(target=target, announced=True))
            lab.driver.verify(AnycastState(target=target, announced=True), timedelta(seconds=10))
        yield lab
    finally:
        for speaker in speakers.values():
            speaker.stop()
        router.stop()


# ------------------------------------------------------------------ l7 (HAProxy)


class _UpstreamHandler(BaseHTTPRequestHandler):
    """An engine stand-in: `/id` names the server, `/stream` holds a chunked body open until released."""

    protocol_version = "HTTP/1.1"
    server: _Upstream

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/stream":
            self.send_response(200)
            self.send_header("X-Upstream", self.server.name)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._chunk(b"token-0\n")
            released = self.server.release_streams.wait(timeout=15)
            for i in range(1, 4):
                self._chunk(f"token-{i}\n".encode() if released else b"never-released\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            return
        body = self.server.name.encode()
        self.send_response(200)
        self.send_header("X-Upstream", self.server.name)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


class _Upstream(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, name: str, release_streams: threading.Event) -> None:
        super().__init__(("127.0.0.1", 0), _UpstreamHandler)
        self.name = name
        self.release_streams = release_streams

    def handle_error(self, request: object, client_address: object) -> None:
        # HAProxy resets idle server-side connections when it stops; anything else is a failure to show.
        if not isinstance(sys.exc_info()[1], ConnectionResetError | BrokenPipeError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


@dataclass
class HaproxyLab:
    """A real HAProxy in front of two loopback upstreams, s1 and s2."""

    haproxy: HaproxyServer
    driver: HaproxyDriver
    release_streams: threading.Event

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.haproxy.frontend_port}"

    def target(self, server: str) -> L7Target:
        return L7Target(backend=self.haproxy.backend, server=server)

    def new_driver(self) -> HaproxyDriver:
        return HaproxyDriver(HaproxyRuntimeApi(("127.0.0.1", self.haproxy.admin_port), timeout_s=1.0))


@pytest.fixture
def haproxy_lab(tmp_path: Path) -> Iterator[HaproxyLab]:
    release = threading.Event()
    upstreams = [_Upstream(name, release) for name in ("s1", "s2")]
    for upstream in upstreams:
        threading.Thread(target=upstream.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    haproxy = HaproxyServer(workdir=tmp_path / "haproxy",
                            servers={u.name: u.server_address[1] for u in upstreams})
    try:
        haproxy.start()
        lab = HaproxyLab(haproxy=haproxy, driver=None, release_streams=release)  # type: ignore[arg-type]
        lab.driver = lab.new_driver()
        yield lab
    finally:
        release.set()
        haproxy.stop()
        for upstream in upstreams:
            upstream.shutdown()
            upstream.server_close()
