"""Real routing daemons for the cutover driver tests (tests/support/daemons.py).

Each fixture starts its daemon in the test's temp dir on spare loopback
ports and stops it by pid at teardown; a daemon that is not installed
fails the test naming its package.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from cutover.driver import AnycastState, AnycastTarget
from cutover.drivers.anycast import AnycastDriver, BirdRouteReader, ExaBgpApi
from cutover.driver import L7Target
from cutover.drivers.dns import EXTERNAL_TTL_S, INTERNAL_TTL_S
from cutover.drivers.haproxy import HaproxyDriver, HaproxyRuntimeApi
from tests.support.daemons import BgpPeer, BindServer, BirdRouter, DnsRecord, ExaBgpSpeaker, HaproxyServer

# The seed's dual TTL: the external record moves at cutover, the internal one does not.
REGION_A = "192.0.2.10"
REGION_B = "198.51.100.10"


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


# ------------------------------------------------------------------ HAProxy
# (Rebuilt after this file was overwritten by mistake in a shared checkout; see the commit.)


def _upstream(name: str, release: threading.Event) -> ThreadingHTTPServer:
    """A loopback HTTP server: /id answers at once, /stream sends one chunk and the rest on `release`."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/stream":
                self.send_response(200)
                self.send_header("X-Upstream", name)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self._chunk(b"token-0\n")
                release.wait(20)
                for i in range(1, 4):
                    self._chunk(f"token-{i}\n".encode())
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                return
            body = name.encode()
            self.send_response(200)
            self.send_header("X-Upstream", name)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@dataclass
class HaproxyLab:
    """A real HAProxy in front of two loopback upstreams, s1 and s2."""

    haproxy: HaproxyServer
    upstreams: dict[str, ThreadingHTTPServer]
    release_streams: threading.Event = field(default_factory=threading.Event)
    driver: HaproxyDriver = None  # type: ignore[assignment]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.haproxy.frontend_port}"

    def target(self, server: str) -> L7Target:
        return L7Target(backend=self.haproxy.backend, server=server)

    def new_driver(self) -> HaproxyDriver:
        return HaproxyDriver(HaproxyRuntimeApi(("127.0.0.1", self.haproxy.admin_port)))


@pytest.fixture
def haproxy_lab(tmp_path: Path) -> Iterator[HaproxyLab]:
    release = threading.Event()
    upstreams = {name: _upstream(name, release) for name in ("s1", "s2")}
    haproxy = HaproxyServer(workdir=tmp_path / "haproxy",
                            servers={name: u.server_address[1] for name, u in upstreams.items()})
    try:
        haproxy.start()
        lab = HaproxyLab(haproxy=haproxy, upstreams=upstreams, release_streams=release)
        lab.driver = lab.new_driver()
        yield lab
    finally:
        release.set()
        haproxy.stop()
        for upstream in upstreams.values():
            upstream.shutdown()
            upstream.server_close()
