"""Cutover drivers: write → verified at the real system, per tier, p50/p99 over N flips.

Each driver flips one target back and forth N times (a region's external
DNS record between two addresses; a zone's BGP announcement withdrawn and
announced; an HAProxy server drained and readied). A run's time is the
driver's own `Verification.time_to_effect_s`: from the start of `apply`
(the write, including its acknowledgement) to the first read-back that
shows the new state (verify polls every 5 ms, the first poll at once). The
daemons are the tests' (lifeline/daemons.py): BIND9, BIRD 2 + two
ExaBGP speakers, HAProxy, moto's Route 53 emulator, all on loopback; the
mesh row is an Istio VirtualService on the Kubernetes API emulator
(lifeline/kube_emulator.py: no API server runs here).

For DNS the time a client needs is this plus `client_cache_ttl_s` (the TTL
of the replaced answer, 60 s for the external record): the column
"client sees it by" adds it, which is what the seed's band (30 s – 5 min)
is about; the write itself is milliseconds.

    .venv/bin/python -m bench.cutover_drivers [--runs 40] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from bench.docs import replace_section
from cutover.drivers.base import (
    EXTERNAL_TTL_S,
    AnycastState,
    AnycastTarget,
    DnsState,
    DnsTarget,
    L7State,
    L7Target,
    Verification,
)
from cutover.drivers.anycast import AnycastDriver, BirdRouteReader, ExaBgpApi
from cutover.drivers.dns import Rfc2136Driver, Route53Driver
from cutover.drivers.haproxy import HaproxyDriver, HaproxyRuntimeApi
from cutover.drivers.polling import PollingDriver
from lifeline.daemons import MotoServer, BgpPeer, BindServer, BirdRouter, DnsRecord, ExaBgpSpeaker, HaproxyServer

HEADING = "## Cutover drivers (bench/cutover_drivers.py)"
TIMEOUT = timedelta(seconds=10)
ZONE = "lifeline.test."
REGION_A, REGION_B = "192.0.2.10", "198.51.100.10"


@dataclass
class Result:
    tier: str
    system: str
    effect_s: list[float]
    write_s: list[float]
    polls: list[int]
    client_cache_ttl_s: int | None


def flip(name: tuple[str, str], driver: PollingDriver, states: tuple[object, object], runs: int) -> Result:
    effect, write, polls = [], [], []
    ttl: int | None = None
    for i in range(runs):
        desired = states[(i + 1) % 2]
        started = time.perf_counter()
        driver.apply(desired)
        write.append(time.perf_counter() - started)
        proof: Verification = driver.verify(desired, TIMEOUT)
        effect.append(proof.time_to_effect_s)
        polls.append(proof.polls)
        ttl = proof.client_cache_ttl_s
    return Result(name[0], name[1], effect, write, polls, ttl)


@contextmanager
def bind_driver(workdir: Path) -> Iterator[tuple[PollingDriver, tuple[object, object]]]:
    server = BindServer(workdir=workdir / "bind", records=[DnsRecord("api", EXTERNAL_TTL_S, "A", REGION_A)]).start()
    try:
        driver = Rfc2136Driver(server=server.host, port=server.port, key_name=server.key_name,
                               key_secret=server.key_secret)
        target = DnsTarget(zone=ZONE, name="api.lifeline.test.")
        yield driver, (DnsState(target=target, values=(REGION_A,), ttl_s=EXTERNAL_TTL_S),
                       DnsState(target=target, values=(REGION_B,), ttl_s=EXTERNAL_TTL_S))
    finally:
        server.stop()


@contextmanager
def route53_driver(workdir: Path) -> Iterator[tuple[PollingDriver, tuple[object, object]]]:
    import boto3

    moto = MotoServer()
    moto.start()
    try:
        client = boto3.client("route53", endpoint_url=moto.endpoint_url, region_name="us-east-1",
                              aws_access_key_id="bench", aws_secret_access_key="bench")
        client.create_hosted_zone(Name=ZONE, CallerReference="bench")
        target = DnsTarget(zone=ZONE, name="api.lifeline.test.")
        driver = Route53Driver(client)
        first = DnsState(target=target, values=(REGION_A,), ttl_s=EXTERNAL_TTL_S)
        driver.apply(first)
        yield driver, (first, DnsState(target=target, values=(REGION_B,), ttl_s=EXTERNAL_TTL_S))
    finally:
        moto.stop()


@contextmanager
def anycast_driver(workdir: Path) -> Iterator[tuple[PollingDriver, tuple[object, object]]]:
    peers = {"zone-a": BgpPeer("zone_a", "127.0.0.2", 65002), "zone-b": BgpPeer("zone_b", "127.0.0.3", 65003)}
    router = BirdRouter(workdir=workdir / "bird", peers=list(peers.values()))
    speakers: dict[str, ExaBgpSpeaker] = {}
    try:
        router.start()
        for zone, peer in peers.items():
            speakers[zone] = ExaBgpSpeaker(workdir=workdir / zone, peer=peer, router=router).start()
        driver = AnycastDriver(speakers={z: ExaBgpApi(s.command_fifo, s.ack_fifo) for z, s in speakers.items()},
                               observer=BirdRouteReader(router.socket_path))
        targets = {z: AnycastTarget(prefix="203.0.113.10/32", zone=z, next_hop=p.address) for z, p in peers.items()}
        for target in targets.values():
            driver.apply(AnycastState(target=target, announced=True))
            driver.verify(AnycastState(target=target, announced=True), TIMEOUT)
        # zone-a flips; zone-b keeps announcing, so each withdrawal moves the best path.
        yield driver, (AnycastState(target=targets["zone-a"], announced=True),
                       AnycastState(target=targets["zone-a"], announced=False))
    finally:
        for speaker in speakers.values():
            speaker.stop()
        router.stop()


class _Quiet(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@contextmanager
def haproxy_driver(workdir: Path) -> Iterator[tuple[PollingDriver, tuple[object, object]]]:
    upstreams = [ThreadingHTTPServer(("127.0.0.1", 0), _Quiet) for _ in range(2)]
    for upstream in upstreams:
        threading.Thread(target=upstream.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    haproxy = HaproxyServer(workdir=workdir / "haproxy",
                            servers={f"s{i + 1}": u.server_address[1] for i, u in enumerate(upstreams)})
    try:
        haproxy.start()
        driver = HaproxyDriver(HaproxyRuntimeApi(("127.0.0.1", haproxy.admin_port)))
        target = L7Target(backend=haproxy.backend, server="s1")
        yield driver, (L7State(target=target, admin_state="ready", weight=100),
                       L7State(target=target, admin_state="drain", weight=100))
    finally:
        haproxy.stop()
        for upstream in upstreams:
            upstream.shutdown()
            upstream.server_close()


@contextmanager
def istio_driver(workdir: Path) -> Iterator[tuple[PollingDriver, tuple[object, object]]]:
    """An Istio VirtualService on the Kubernetes API emulator (lifeline/kube_emulator.py; istiod's status emulated)."""
    from kubernetes.client import ApiClient, Configuration

    from cutover.drivers.base import MeshState, MeshTarget
    from cutover.drivers.istio import IstioVirtualServiceDriver
    from lifeline.kube_emulator import KubeApiEmulator

    host = "llm.serving.svc.cluster.local"
    with KubeApiEmulator() as api:
        api.add_virtual_service({
            "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": "llm", "namespace": "serving"},
            "spec": {"hosts": [host], "http": [{"name": "default", "route": [
                {"destination": {"host": host, "subset": z}, "weight": 50} for z in ("zone-a", "zone-b")]}]}})
        configuration = Configuration()
        configuration.host = api.url
        client = ApiClient(configuration)
        target = MeshTarget(namespace="serving", virtual_service="llm", route="default",
                            destinations=(f"{host}/zone-a",))
        try:
            yield IstioVirtualServiceDriver(client), (
                MeshState(target=target, weights={f"{host}/zone-a": 50, f"{host}/zone-b": 50}),
                MeshState(target=target, weights={f"{host}/zone-a": 0, f"{host}/zone-b": 100}))
        finally:
            client.close()


BENCHES: list[tuple[tuple[str, str], Callable[[Path], object]]] = [
    (("l7", "HAProxy 2.6 runtime API: drain ↔ ready"), haproxy_driver),
    (("mesh", "Istio VirtualService, emulated API server: weight 50 ↔ 0"), istio_driver),
    (("anycast", "ExaBGP 5 → BIRD 2: withdraw ↔ announce"), anycast_driver),
    (("dns", "BIND 9.18, RFC 2136 + TSIG: A record flip"), bind_driver),
    (("dns", "Route 53 (moto emulator): UPSERT flip"), route53_driver),
]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def report(runs: int, results: list[Result]) -> str:
    lines = [
        f"{runs} flips per row, x86_64, Python {platform.python_version()}, on a shared 2-core machine, every "
        "daemon on loopback. write → verified is the driver's `Verification.time_to_effect_s`: from the start of "
        "`apply` (write plus its acknowledgement) to the first read-back from the real system that shows the new "
        "state (BIND: a UDP query to the authoritative server; anycast: `birdc show route … all` at the observing "
        "BIRD; HAProxy: `show servers state`; Route 53: `ListResourceRecordSets` after `GetChange` is INSYNC; "
        "Istio: the VirtualService read back with istiod's Reconciled status, on the Kubernetes API emulator). "
        "Verification polls every 5 ms, the first poll at once, so 1 poll means the write was visible on the first "
        "read. For DNS a client sees the new answer only after its cached copy expires: the last column adds the "
        "replaced answer's TTL (the short external record, 60 s; the long internal one, 600 s where configured, "
        "bounds only the region's own services and is not timed here). "
        "The DNS drivers' write includes one read of the record they replace (to report its TTL).",
        "",
        "| tier | system | runs | write p50 ms | write → verified p50 ms | p99 ms | max ms | polls p50 "
        "| client sees it by (p99 + TTL) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        p99 = _pct(r.effect_s, 0.99)
        client = f"{p99 + r.client_cache_ttl_s:.1f} s" if r.client_cache_ttl_s else "= write → verified"
        lines.append(
            f"| {r.tier} | {r.system} | {len(r.effect_s)} | {statistics.median(r.write_s) * 1000:.1f} "
            f"| {statistics.median(r.effect_s) * 1000:.1f} | {p99 * 1000:.1f} | {max(r.effect_s) * 1000:.1f} "
            f"| {statistics.median(r.polls):.0f} | {client} |")
    lines += [
        "",
        "Bands per tier: L7 milliseconds, mesh sub-second, anycast seconds, DNS 30 s – 5 min including "
        "TTL. On loopback every write is in effect at the first router/server within milliseconds; what remains "
        "of the anycast band is BGP propagation beyond the first router, and of the DNS band the TTL column — "
        "which is why the cutover moves the 60 s record. The moto row measures the emulator, not Route 53's "
        "propagation (AWS: PENDING → INSYNC, typically within 60 s), and the Istio row the emulator, whose istiod "
        "reports Reconciled at once (a real one pushes to every Envoy first). Whole cutovers, with the control "
        "plane's commits and events, are bench/cutover.py's section.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--write", type=Path, help="replace this section of docs/benchmarks.md")
    args = parser.parse_args()
    if args.runs < 20:
        parser.error("--runs must be at least 20 (p99 over fewer is meaningless)")
    results = []
    with tempfile.TemporaryDirectory(prefix="lifeline-cutover-bench-") as tmp:
        for index, (name, setup) in enumerate(BENCHES):
            with setup(Path(tmp) / str(index)) as (driver, states):  # type: ignore[attr-defined]
                results.append(flip(name, driver, states, args.runs))
    table = report(args.runs, results)
    print(table)
    if args.write:
        replace_section(args.write, HEADING, table)


if __name__ == "__main__":
    main()
