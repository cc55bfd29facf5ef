"""The routing tiers the demo runs for real where the machine has them: BIND9 (dns), BIRD 2 + ExaBGP (anycast), HAProxy (l7).

The daemons are `lifeline.daemons`' (the same helpers the cutover driver
tests start), on spare loopback ports in the work dir. The served control
plane drives them through `LIFELINE_CONTROLPLANE_CUTOVER_DRIVERS_FILE`
(cutover/drivers_file.py), which this module writes. A daemon that is not
installed is not installed here either: its tier is then *recorded only*
(the control plane's cutover step changes nothing and says so), and
`notes` says which ran for real and which did not, and why.

HAProxy is the primary region's L7 entry: the primary's gateway as its
server, the standby region's gateway as `backup` (used only while no
primary server can take traffic), the admin socket a UNIX path the l7
tier's HAProxy driver (cutover/drivers/haproxy.py) writes `set server …
state drain` to. It starts once the gateways listen (`start_haproxy`); the
drivers file names it from the start (nothing is dialled at start-up).
With it the cutover policy's `min_wait` is 0: one region loss is cut over
at two tiers back to back (l7 on HAProxy, then dns), which the anti-flap
wait between cutovers of one scope would otherwise hold for five minutes.
"""

from __future__ import annotations

import shutil
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from lifeline.daemons import (
    BgpPeer,
    BindServer,
    BirdRouter,
    DaemonMissing,
    DaemonProcess,
    DnsRecord,
    ExaBgpSpeaker,
    require_binary,
)
from lifeline.processes import free_port

SERVICE_PREFIX = "203.0.113.10/32"  # TEST-NET-3: the anycast address every zone announces
DNS_ZONE = "lifeline.test."
DNS_NAME = f"api.{DNS_ZONE}"
DNS_TTL_S = 30
HAPROXY_BACKEND = "gateways"


class GatewayHaproxy(DaemonProcess):
    """haproxy -db in front of gateways: one server per region (all but the first as backup), admin on a UNIX socket."""

    def __init__(self, workdir: Path) -> None:
        DaemonProcess.__init__(self, "haproxy", workdir)
        self.socket_path = workdir / "admin.sock"
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, servers: dict[str, int]) -> GatewayHaproxy:
        """`servers`: server name → gateway port on 127.0.0.1, the primary first."""
        haproxy = require_binary("haproxy", "haproxy")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        lines = [f"    server {name} 127.0.0.1:{port}{' backup' if i else ''}"
                 for i, (name, port) in enumerate(servers.items())]
        # Streams last seconds, and a stalled one is the gateway's to move (its stall timeout): generous timeouts.
        (self.workdir / "haproxy.cfg").write_text(
            "global\n"
            f"    stats socket {self.socket_path} level admin\n"
            f"    pidfile {self.workdir}/haproxy.pid\n"
            "defaults\n    mode http\n    timeout connect 1s\n    timeout client 120s\n    timeout server 120s\n"
            f"frontend api\n    bind 127.0.0.1:{self.port}\n    default_backend {HAPROXY_BACKEND}\n"
            f"backend {HAPROXY_BACKEND}\n    balance roundrobin\n" + "\n".join(lines) + "\n")
        self.spawn([haproxy, "-db", "-f", str(self.workdir / "haproxy.cfg")])
        self.wait_until(lambda: self.socket_path.exists() and _listening(self.port), f"listening on {self.port}")
        return self

    def admin_state(self, server: str) -> str:
        """ready | drain | maint, as the runtime API shows it now."""
        from cutover.drivers.base import L7Target
        from cutover.drivers.haproxy import HaproxyDriver, HaproxyRuntimeApi

        state, _ = HaproxyDriver(HaproxyRuntimeApi(self.socket_path)).observe(L7Target(backend=HAPROXY_BACKEND,
                                                                                       server=server))
        return state.admin_state


def _listening(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.3):
            return True
    except OSError:
        return False


@dataclass
class RealTiers:
    workdir: Path
    region_answers: dict[str, str]  # region → the A record's value while it serves (TEST-NET addresses)
    anycast_zones: list[tuple[str, str]]  # (region, zone) pairs that announce SERVICE_PREFIX
    bind: BindServer | None = None
    bird: BirdRouter | None = None
    speakers: dict[str, ExaBgpSpeaker] = field(default_factory=dict)
    next_hops: dict[str, str] = field(default_factory=dict)  # zone → its speaker's address
    notes: dict[str, str] = field(default_factory=dict)  # tier → what ran for real, or why it did not
    haproxy: GatewayHaproxy | None = None  # configured; started by start_haproxy once the gateways listen

    def start(self) -> Path:
        """Start what is installed; write the drivers file for the control plane. Returns the file."""
        # A fresh directory: named replays its journal (zone.db.jnl) over the zone file, so an earlier run's
        # DNS cutover would otherwise still be the answer.
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir.mkdir(parents=True)
        sections: list[str] = []
        try:
            sections.append(self._start_dns())
            self.notes["dns"] = (f"real: BIND9 authoritative for {DNS_ZONE} on 127.0.0.1:{self.bind.port}, "  # type: ignore[union-attr]
                                 "updated by RFC 2136 + TSIG")
        except (DaemonMissing, RuntimeError) as exc:
            self.bind = None
            self.notes["dns"] = f"recorded only: {_first_line(exc)}"
        try:
            sections.append(self._start_anycast())
            self.notes["anycast"] = (f"real: {len(self.speakers)} ExaBGP speakers announce {SERVICE_PREFIX} to BIRD 2 "
                                     f"(zones {', '.join(self.speakers)})")
        except (DaemonMissing, RuntimeError) as exc:
            self._stop_anycast()
            self.notes["anycast"] = f"recorded only: {_first_line(exc)}"
        self.notes["l7"] = "real: the control plane's snapshot, applied by each region's gateway; the gateways' own ejections"
        try:
            sections.append(self._haproxy_section())
        except DaemonMissing as exc:
            self.haproxy = None
            self.notes["l7"] += f"; HAProxy recorded only: {_first_line(exc)}"
        self.notes["mesh"] = ("real: mesh routes in the control plane's snapshot, applied by each region's gateway; "
                              "no Istio here (Kubernetes is not run by the demo)")
        path = self.workdir / "cutover-drivers.toml"
        path.write_text("\n".join(sections) + "\n")
        return path

    # -- dns ---------------------------------------------------------------------------------
    def _start_dns(self) -> str:
        first = next(iter(self.region_answers.values()))
        self.bind = BindServer(workdir=self.workdir / "bind", zone=DNS_ZONE,
                               records=[DnsRecord("api", DNS_TTL_S, "A", first)]).start()
        secret = self.workdir / "bind" / "tsig.secret"
        secret.write_text(self.bind.key_secret)
        regions = list(self.region_answers)
        lines = ["[dns]", f'zone = "{DNS_ZONE}"', f'name = "{DNS_NAME}"', f"ttl_s = {DNS_TTL_S}", "[dns.rfc2136]",
                 f'server = "{self.bind.host}"', f"port = {self.bind.port}", f'key_name = "{self.bind.key_name}"',
                 f'key_secret_file = "{secret}"']
        for i, (region, answer) in enumerate(self.region_answers.items()):
            lines += [f"[dns.regions.{region}]", f'answer = ["{answer}"]',
                      f'failover_to = "{regions[(i + 1) % len(regions)]}"']
        return "\n".join(lines)

    def dns_answer(self) -> list[str]:
        """The A record's values as BIND9 answers them now."""
        import dns.message
        import dns.query

        assert self.bind is not None
        response = dns.query.udp(dns.message.make_query(DNS_NAME, "A"), self.bind.host, port=self.bind.port, timeout=2)
        return sorted(r.address for rrset in response.answer for r in rrset)

    # -- l7: HAProxy in front of the gateways ---------------------------------------------------
    def _haproxy_section(self) -> str:
        require_binary("haproxy", "haproxy")
        self.haproxy = GatewayHaproxy(self.workdir / "haproxy")
        lines = ["[haproxy]", f'runtime_api = "{self.haproxy.socket_path}"', "[haproxy.servers]"]
        lines += [f'"region:{region}" = ["{HAPROXY_BACKEND}/{server_name(region)}"]' for region in self.region_answers]
        return "\n".join(lines + ["[policy]", "min_wait = 0"])

    def start_haproxy(self, gateway_ports: dict[str, int]) -> str | None:
        """Start HAProxy in front of the gateways (`gateway_ports`: region → port, the primary first); its URL."""
        if self.haproxy is None:
            return None
        try:
            self.haproxy.start({server_name(region): port for region, port in gateway_ports.items()})
        except (DaemonMissing, RuntimeError) as exc:
            self.notes["l7"] += f"; HAProxy did not start: {_first_line(exc)}"
            self.haproxy = None
            return None
        primary, *standby = gateway_ports
        self.notes["l7"] += (f"; HAProxy on {self.haproxy.url} in front of {primary}'s gateway ("
                             f"{', '.join(standby) or 'no'} backup), drained by the l7 tier's runtime-API driver")
        return self.haproxy.url

    # -- anycast -----------------------------------------------------------------------------
    def _start_anycast(self) -> str:
        from cutover.drivers.anycast import AnycastDriver, ExaBgpApi
        from cutover.drivers.base import AnycastState, AnycastTarget

        peers = {zone: BgpPeer(zone.replace("-", "_"), f"127.0.0.{i + 2}", 65002 + i)
                 for i, (_, zone) in enumerate(self.anycast_zones)}
        self.bird = BirdRouter(workdir=self.workdir / "bird", peers=list(peers.values())).start()
        errors: list[BaseException] = []

        def start(zone: str, peer: BgpPeer) -> None:
            try:
                self.speakers[zone] = ExaBgpSpeaker(workdir=self.workdir / f"exabgp-{zone}", peer=peer,
                                                    router=self.bird).start()  # type: ignore[arg-type]
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=start, args=item) for item in peers.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise RuntimeError(str(errors[0]))
        self.next_hops = {zone: peer.address for zone, peer in peers.items()}
        # Every zone announces at the start, as a serving zone does; a zonal shift withdraws one.
        driver = AnycastDriver(speakers={z: ExaBgpApi(s.command_fifo, s.ack_fifo, ack_timeout_s=2.0)
                                         for z, s in self.speakers.items()},
                               observer=self.observer())
        for zone, hop in self.next_hops.items():
            state = AnycastState(target=AnycastTarget(prefix=SERVICE_PREFIX, zone=zone, next_hop=hop), announced=True)
            driver.apply(state)
            if not driver.verify(state, timedelta(seconds=15)).verified:
                raise RuntimeError(f"BIRD never saw {zone}'s announcement of {SERVICE_PREFIX}")
        lines = ["[anycast]", f'prefix = "{SERVICE_PREFIX}"', f'birdc_socket = "{self.bird.socket_path}"']
        for region, zone in self.anycast_zones:
            speaker = self.speakers[zone]
            lines += ["[[anycast.zones]]", f'region = "{region}"', f'zone = "{zone}"',
                      f'next_hop = "{self.next_hops[zone]}"', f'command_fifo = "{speaker.command_fifo}"',
                      f'ack_fifo = "{speaker.ack_fifo}"']
        return "\n".join(lines)

    def observer(self):  # noqa: ANN201 - cutover's BirdRouteReader
        from cutover.drivers.anycast import BirdRouteReader

        assert self.bird is not None
        return BirdRouteReader(self.bird.socket_path)

    def announcing(self) -> list[str]:
        """The zones whose path to SERVICE_PREFIX BIRD holds now (`birdc show route … all`)."""
        paths, _ = self.observer().paths(SERVICE_PREFIX)
        by_hop = {hop: zone for zone, hop in self.next_hops.items()}
        return sorted(by_hop.get(p.next_hop, p.next_hop) for p in paths)

    def _stop_anycast(self) -> None:
        for speaker in self.speakers.values():
            _stop(speaker)
        self.speakers.clear()
        if self.bird is not None:
            _stop(self.bird)
            self.bird = None

    def stop(self) -> None:
        try:
            self._stop_anycast()
        finally:
            try:
                if self.haproxy is not None:
                    _stop(self.haproxy)
            finally:
                if self.bind is not None:
                    _stop(self.bind)


def _stop(daemon: DaemonProcess) -> None:
    """SIGTERM (DaemonProcess.stop escalates to SIGKILL itself); whatever fails, the next daemon is still stopped."""
    try:
        daemon.stop()
    except Exception:  # noqa: BLE001 - the next daemon must still be stopped
        daemon.kill()


def server_name(region: str) -> str:
    """HAProxy's server for a region's gateway: the gateway's replica id."""
    return f"gw-{region}"


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
