"""Real routing daemons for the cutover driver tests (tests/support/daemons.py).

Each fixture starts its daemon in the test's temp dir on spare loopback
ports and stops it by pid at teardown; a daemon that is not installed
fails the test naming its package.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest

from cutover.driver import AnycastState, AnycastTarget
from cutover.drivers.anycast import AnycastDriver, BirdRouteReader, ExaBgpApi
from cutover.drivers.dns import EXTERNAL_TTL_S, INTERNAL_TTL_S
from tests.support.daemons import BgpPeer, BindServer, BirdRouter, DnsRecord, ExaBgpSpeaker

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
