"""Real daemons on loopback for the cutover drivers' tests, benchmarks and the demo.

BIND9 (authoritative, RFC 2136 with TSIG), BIRD 2 (the observing BGP
router), ExaBGP (one announcing speaker per zone) and HAProxy (runtime API
over TCP), each started in the foreground in its own temp dir on spare
loopback ports and stopped by pid (nothing here runs under systemd). The
settings that were needed: BIND in the foreground without a user switch
(`-u root -g`), `recursion no` and an empty `controls`; BIRD with `strict
bind yes` (else it listens on 0.0.0.0) and `multihop 2`, next hops resolved
through a table of its own (it ignores `lo`); ExaBGP with
`exabgp_daemon_drop=false` (else it drops to nobody) and its log on stdout
(its log file fails on permissions).

A daemon that is not installed raises `DaemonMissing` naming the package to
install (`make test` and `.ci/run` install them), so a test fails, never skips.
`MotoServer` is moto's AWS emulator (S3, Route 53) as a real HTTP server. Every wait is
bounded and raises with the daemon's log tail.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lifeline.processes import free_port


class DaemonMissing(RuntimeError):
    """A daemon the caller needs is not installed; the message names the package (CI installs it)."""

    def __init__(self, message: str, *, pytrace: bool = True) -> None:
        # `pytrace` mirrors pytest.fail's: callers pass it; RuntimeError itself takes no keywords.
        super().__init__(message)
        self.pytrace = pytrace


def require_binary(name: str, package: str) -> str:
    """The path of `name`, or fail the test naming the package that provides it."""
    found = shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/usr/bin") / name) if p.exists()), None)
    if found is None:
        raise DaemonMissing(f"{name} is not installed: `apt-get install -y {package}` "
                    f"(make test and .ci/run install it)", pytrace=False)
    return found


class DaemonProcess:
    """One foreground daemon: started with its log captured, stopped by its own pid."""

    def __init__(self, name: str, workdir: Path) -> None:
        self.name = name
        self.workdir = workdir
        self.log_path = workdir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def spawn(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(argv, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env, start_new_session=True)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return "(no log)"

    def fail(self, why: str) -> None:
        self.stop()
        raise RuntimeError(f"{self.name}: {why}\n--- log tail ---\n{self.log_tail()}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_until(self, ready, what: str, timeout: float = 20.0) -> None:  # noqa: ANN001
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                self.fail(f"exited with {self.process.returncode if self.process else '?'} before {what}")
            if ready():
                return
            time.sleep(0.05)
        self.fail(f"not {what} within {timeout:g}s")

    def kill(self) -> None:
        """SIGKILL, no goodbye (no BGP NOTIFICATION, no clean close)."""
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if not self.alive():
            return
        assert self.process is not None
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def _tcp_listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


# ------------------------------------------------------------------ BIND9


@dataclass
class DnsRecord:
    name: str  # relative to the zone: "api"
    ttl: int
    rdtype: str
    value: str


@dataclass
class BindServer(DaemonProcess):
    """named, authoritative for one zone, updatable with one TSIG key (`zonesub ANY`)."""

    workdir: Path
    zone: str = "lifeline.test."
    records: list[DnsRecord] = field(default_factory=list)
    key_name: str = "lifeline-cutover."
    key_algorithm: str = "hmac-sha256"
    host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        DaemonProcess.__init__(self, "named", self.workdir)
        self.port = free_port()
        self.key_secret = base64.b64encode(secrets.token_bytes(32)).decode()

    def start(self) -> BindServer:
        named = require_binary("named", "bind9")
        self.workdir.mkdir(parents=True, exist_ok=True)
        zone_lines = [
            f"$ORIGIN {self.zone}",
            "$TTL 600",
            f"@ 600 IN SOA ns1.{self.zone} hostmaster.{self.zone} 1 3600 600 86400 60",
            f"@ 600 IN NS ns1.{self.zone}",
            f"ns1 600 IN A {self.host}",
            *(f"{r.name} {r.ttl} IN {r.rdtype} {r.value}" for r in self.records),
        ]
        (self.workdir / "zone.db").write_text("\n".join(zone_lines) + "\n")
        (self.workdir / "named.conf").write_text(textwrap.dedent(f"""\
            key "{self.key_name}" {{ algorithm {self.key_algorithm}; secret "{self.key_secret}"; }};
            options {{
                directory "{self.workdir}";
                listen-on port {self.port} {{ {self.host}; }};
                listen-on-v6 {{ none; }};
                pid-file "{self.workdir}/named.pid";
                recursion no;
                notify no;
            }};
            controls {{ }};
            zone "{self.zone}" {{
                type primary;
                file "{self.workdir}/zone.db";
                update-policy {{ grant {self.key_name} zonesub ANY; }};
            }};
            """))
        self.spawn([named, "-c", str(self.workdir / "named.conf"), "-u", "root", "-g", "-4"])
        self.wait_until(self._answers_soa, f"answering SOA for {self.zone} on {self.host}:{self.port}")
        return self

    def _answers_soa(self) -> bool:
        import dns.message
        import dns.query
        import dns.rcode

        try:
            answer = dns.query.udp(dns.message.make_query(self.zone, "SOA"), self.host, port=self.port, timeout=0.3)
        except Exception:  # noqa: BLE001 - not up yet
            return False
        return answer.rcode() == dns.rcode.NOERROR and bool(answer.answer)


# ------------------------------------------------------------------ HAProxy


@dataclass
class HaproxyServer(DaemonProcess):
    """haproxy in the foreground (-db) with a TCP admin socket and one backend of loopback servers."""

    workdir: Path
    backend: str = "engines"
    servers: dict[str, int] = field(default_factory=dict)  # server name -> upstream port on 127.0.0.1
    mode: str = "http"

    def __post_init__(self) -> None:
        DaemonProcess.__init__(self, "haproxy", self.workdir)
        self.frontend_port = free_port()
        self.admin_port = free_port()

    def start(self) -> HaproxyServer:
        haproxy = require_binary("haproxy", "haproxy")
        self.workdir.mkdir(parents=True, exist_ok=True)
        server_lines = "\n".join(f"    server {name} 127.0.0.1:{port} weight 100"
                                 for name, port in self.servers.items())
        (self.workdir / "haproxy.cfg").write_text(
            "global\n"
            f"    stats socket ipv4@127.0.0.1:{self.admin_port} level admin\n"
            f"    pidfile {self.workdir}/haproxy.pid\n"
            "defaults\n"
            f"    mode {self.mode}\n"
            "    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n"
            f"frontend inference\n    bind 127.0.0.1:{self.frontend_port}\n    default_backend {self.backend}\n"
            f"backend {self.backend}\n    balance roundrobin\n{server_lines}\n")
        self.spawn([haproxy, "-db", "-f", str(self.workdir / "haproxy.cfg")])
        self.wait_until(lambda: _tcp_listening("127.0.0.1", self.admin_port)
                        and _tcp_listening("127.0.0.1", self.frontend_port),
                        f"listening on {self.frontend_port} (admin {self.admin_port})")
        return self


# ------------------------------------------------------------------ BIRD 2 + ExaBGP


@dataclass
class BirdRouter(DaemonProcess):
    """BIRD 2 as the observing router: one passive-capable BGP session per announcer, import all."""

    workdir: Path
    address: str = "127.0.0.1"
    asn: int = 65001
    peers: list[BgpPeer] = field(default_factory=list)

    def __post_init__(self) -> None:
        DaemonProcess.__init__(self, "bird", self.workdir)
        self.port = free_port()
        self.socket_path = self.workdir / "bird.ctl"

    def start(self) -> BirdRouter:
        bird = require_binary("bird", "bird2")
        require_binary("birdc", "bird2")
        self.workdir.mkdir(parents=True, exist_ok=True)
        protocols = "\n".join(textwrap.dedent(f"""\
            protocol bgp {peer.name} {{
                local {self.address} port {self.port} as {self.asn};
                neighbor {peer.address} port {peer.port} as {peer.asn};
                strict bind yes;
                multihop 2;
                connect retry time 1;
                error wait time 1, 5;
                ipv4 {{ import all; export none; igp table igp4; }};
            }}
            """) for peer in self.peers)
        (self.workdir / "bird.conf").write_text(textwrap.dedent(f"""\
            router id {self.address};
            ipv4 table igp4;
            protocol device {{ }}
            protocol static {{ ipv4 {{ table igp4; }}; route 0.0.0.0/1 via "lo"; }}
            """) + protocols)
        self.spawn([bird, "-f", "-c", str(self.workdir / "bird.conf"), "-s", str(self.socket_path),
                    "-P", str(self.workdir / "bird.pid")])
        self.wait_until(lambda: self.socket_path.exists() and self.birdc("show status").returncode == 0,
                        "answering on its control socket")
        return self

    def birdc(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["birdc", "-s", str(self.socket_path), *command.split()],
                              capture_output=True, text=True, timeout=10)

    def established(self, peer: BgpPeer) -> bool:
        return "Established" in self.birdc(f"show protocols {peer.name}").stdout


@dataclass
class BgpPeer:
    """Where an announcer lives, as the observing router sees it."""

    name: str
    address: str
    asn: int
    port: int = field(default_factory=free_port)


@dataclass
class ExaBgpSpeaker(DaemonProcess):
    """ExaBGP announcing for one zone, driven through its process API.

    ExaBGP runs `cutover/drivers/exabgp_bridge.py` as its API process, which
    copies lines from `commands.fifo` to ExaBGP and ExaBGP's acks
    (`exabgp_api_ack`) to `acks.fifo`: the production wiring, in a temp dir.
    """

    workdir: Path
    peer: BgpPeer
    router: BirdRouter

    def __post_init__(self) -> None:
        DaemonProcess.__init__(self, f"exabgp-{self.peer.name}", self.workdir)
        self.command_fifo = self.workdir / "commands.fifo"
        self.ack_fifo = self.workdir / "acks.fifo"

    def start(self) -> ExaBgpSpeaker:
        exabgp = shutil.which("exabgp") or str(Path(sys.executable).with_name("exabgp"))
        if not Path(exabgp).exists():
            raise DaemonMissing("exabgp is not installed: `pip install exabgp` (a dependency in pyproject.toml)",
                        pytrace=False)
        self.workdir.mkdir(parents=True, exist_ok=True)
        for fifo in (self.command_fifo, self.ack_fifo):
            if not fifo.exists():
                os.mkfifo(fifo)
        bridge = Path(importlib.util.find_spec("cutover.drivers.exabgp_bridge").origin)  # type: ignore[union-attr, arg-type]
        (self.workdir / "exabgp.conf").write_text(textwrap.dedent(f"""\
            process api-bridge {{
                run {sys.executable} {bridge} {self.command_fifo} {self.ack_fifo};
                encoder text;
            }}
            neighbor {self.router.address} {{
                router-id {self.peer.address};
                local-address {self.peer.address};
                local-as {self.peer.asn};
                peer-as {self.router.asn};
                connect {self.router.port};
                listen {self.peer.port};
                api {{ processes [ api-bridge ]; }}
            }}
            """))
        env = {**os.environ, "exabgp_daemon_drop": "false", "exabgp_api_ack": "true",
               "exabgp_log_destination": "stdout", "exabgp_daemon_daemonize": "false",
               "exabgp_api_cli": "false"}
        self.spawn([exabgp, str(self.workdir / "exabgp.conf")], env=env)
        self.wait_until(lambda: self.router.established(self.peer), "Established with BIRD", timeout=30)
        return self

class MotoServer:
    """moto's S3 emulator as a real HTTP server in a child process."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        executable = Path(sys.executable).with_name("moto_server")
        self.process = subprocess.Popen(
            [str(executable), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"moto_server exited with {self.process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("moto_server did not listen in time")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )


# ------------------------------------------------------------------ Redis Sentinel


class RedisNode(DaemonProcess):
    """One redis-server on a spare loopback port, AOF fsynced on every write (a full stop and start keeps it)."""

    def __init__(self, workdir: Path, port: int, replica_of: int | None = None) -> None:
        DaemonProcess.__init__(self, f"redis-{port}", workdir)
        self.port = port
        self.replica_of = replica_of
        self.conf = workdir / f"redis-{port}.conf"

    def start(self) -> RedisNode:
        server = require_binary("redis-server", "redis-server")
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not self.conf.exists():  # a restart keeps the file Sentinel may have rewritten (replicaof …)
            data = self.workdir / f"data-{self.port}"
            data.mkdir(parents=True, exist_ok=True)
            lines = [f"port {self.port}", "bind 127.0.0.1", "protected-mode no", "daemonize no",
                     f"dir {data}", 'save ""', "appendonly yes", "appendfsync always",
                     "repl-diskless-sync yes", "repl-diskless-sync-delay 0"]
            if self.replica_of is not None:
                lines.append(f"replicaof 127.0.0.1 {self.replica_of}")
            self.conf.write_text("\n".join(lines) + "\n")
        self.spawn([server, str(self.conf)])
        self.wait_until(lambda: _redis_answers(self.port), f"answering PING on 127.0.0.1:{self.port}")
        return self

    def pause(self) -> None:
        """SIGSTOP: connections are accepted by the kernel and never answered (a silent Redis)."""
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signal.SIGCONT)


def _redis_answers(port: int, command: bytes = b"PING") -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.3) as sock:
            sock.settimeout(0.3)
            sock.sendall(command + b"\r\n")
            return sock.recv(64).startswith((b"+PONG", b"*", b"$", b"+"))
    except OSError:
        return False


class RedisSentinelLab:
    """A primary, two replicas and three sentinels (quorum 2, down-after 1 s) on spare loopback ports.

    Two replicas, not one: the lease registry hands a generation out only once a
    replica has it (`WAIT 1`, see `contract.lease`), so after a failover the new
    primary needs a replica of its own to keep registrations going while the
    old primary is dead.

    Sentinels are started already knowing each other and the replica (`sentinel myid`,
    `known-sentinel`, `known-replica`), so the lab is ready for a failover in about a
    second instead of the 5-10 s of discovery by hello messages and INFO. Every
    process is stopped by its own pid. `url` is the `redis+sentinel://` URL clients use.
    """

    service = "lifeline"

    def __init__(self, workdir: Path, *, replicas: int = 2, down_after_ms: int = 1000, failover_timeout_ms: int = 5000) -> None:
        self.workdir = workdir
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        primary_port = free_port()
        self.nodes = [RedisNode(workdir, primary_port),
                      *(RedisNode(workdir, free_port(), replica_of=primary_port) for _ in range(replicas))]
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels = [DaemonProcess(f"sentinel-{p}", workdir) for p in self.sentinel_ports]
        self._ids = [secrets.token_hex(20) for _ in self.sentinel_ports]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.service}?db=0"

    def node(self, port: int) -> RedisNode:
        return next(n for n in self.nodes if n.port == port)

    def start(self) -> RedisSentinelLab:
        sentinel_bin = require_binary("redis-sentinel", "redis-sentinel")
        primary, *replicas = self.nodes
        try:
            for node in self.nodes:
                node.start()
            deadline = time.monotonic() + 20
            for replica in replicas:
                while b"master_link_status:up" not in self._info(replica.port):
                    if time.monotonic() > deadline:
                        replica.fail("replica never linked to the primary")
                    time.sleep(0.05)
            for port, myid, proc in zip(self.sentinel_ports, self._ids, self.sentinels, strict=True):
                conf = self.workdir / f"sentinel-{port}.conf"
                lines = [f"port {port}", "bind 127.0.0.1", "daemonize no", f"dir {self.workdir}",
                         f"sentinel myid {myid}",
                         f"sentinel monitor {self.service} 127.0.0.1 {primary.port} 2",
                         f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}",
                         f"sentinel failover-timeout {self.service} {self.failover_timeout_ms}",
                         f"sentinel parallel-syncs {self.service} 1",
                         *(f"sentinel known-replica {self.service} 127.0.0.1 {r.port}" for r in replicas)]
                lines += [f"sentinel known-sentinel {self.service} 127.0.0.1 {p} {i}"
                          for p, i in zip(self.sentinel_ports, self._ids, strict=True) if p != port]
                conf.write_text("\n".join(lines) + "\n")
                proc.spawn([sentinel_bin, str(conf)])
            for port, proc in zip(self.sentinel_ports, self.sentinels, strict=True):
                proc.wait_until(lambda port=port: self._sentinel_ready(port), "knowing the primary, replica and peers")
        except BaseException:
            self.stop()
            raise
        return self

    def _info(self, port: int) -> bytes:
        import redis

        try:
            client = redis.Redis(port=port, socket_timeout=0.5, socket_connect_timeout=0.5)
            try:
                return "\n".join(f"{k}:{v}" for k, v in client.info("replication").items()).encode()
            finally:
                client.close()
        except Exception:  # noqa: BLE001 - not up
            return b""

    def _sentinel(self, port: int):
        import redis

        return redis.Redis(port=port, socket_timeout=0.5, socket_connect_timeout=0.5, decode_responses=True)

    def _sentinel_ready(self, port: int) -> bool:
        try:
            client = self._sentinel(port)
            try:
                master = client.execute_command("SENTINEL", "MASTER", self.service)
                replicas = client.execute_command("SENTINEL", "REPLICAS", self.service)
                peers = client.execute_command("SENTINEL", "SENTINELS", self.service)
            finally:
                client.close()
        except Exception:  # noqa: BLE001 - not up yet
            return False
        return bool(master) and len(replicas) >= len(self.nodes) - 1 and len(peers) >= 2

    def primary_port(self) -> int:
        """The primary as a majority of the sentinels now see it."""
        votes: dict[int, int] = {}
        for port in self.sentinel_ports:
            try:
                client = self._sentinel(port)
                try:
                    _, master_port = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
                finally:
                    client.close()
                votes[int(master_port)] = votes.get(int(master_port), 0) + 1
            except Exception:  # noqa: BLE001,S112 - a paused sentinel does not vote
                continue
        if not votes:
            raise RuntimeError("no sentinel answered")
        return max(votes, key=lambda p: votes[p])

    def primary(self) -> RedisNode:
        return self.node(self.primary_port())

    def replicas(self) -> list[RedisNode]:
        primary = self.primary_port()
        return [n for n in self.nodes if n.port != primary]

    def wait_for_failover(self, old_primary: int, timeout: float = 30.0) -> int:
        """Block until the sentinels name another primary and it answers as one; its port."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                port = self.primary_port()
            except RuntimeError:
                port = old_primary
            if port != old_primary and b"role:master" in self._info(port):
                return port
            time.sleep(0.05)
        raise RuntimeError(f"no failover away from {old_primary} within {timeout:g}s\n"
                           + "\n".join(s.log_tail(1500) for s in self.sentinels))

    def wait_settled(self, timeout: float = 60.0) -> int:
        """Block until every sentinel names one primary and every live replica has synced from it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ports = set()
            for port in self.sentinel_ports:
                try:
                    client = self._sentinel(port)
                    try:
                        ports.add(int(client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)[1]))
                    finally:
                        client.close()
                except Exception:  # noqa: BLE001 - a sentinel not answering is not settled
                    ports.add(-1)
            if len(ports) == 1 and (primary := ports.pop()) > 0 and b"role:master" in self._info(primary):
                replicas = [n for n in self.nodes if n.port != primary and n.alive()]
                if all(b"master_link_status:up" in self._info(n.port) and f"master_port:{primary}".encode()
                       in self._info(n.port) for n in replicas):
                    return primary
            time.sleep(0.1)
        raise RuntimeError(f"the Sentinel lab did not settle within {timeout:g}s")

    def stop(self) -> None:
        for proc in [*self.sentinels, *self.nodes]:
            if isinstance(proc, RedisNode):
                proc.resume()  # a stopped process cannot take SIGTERM
            elif proc.alive() and proc.process is not None:
                proc.process.send_signal(signal.SIGCONT)
            proc.stop()
