"""Region and zone drills on two real regions, cut over by Lifeline itself at real BIND9 and real BIRD 2 + ExaBGP.

The fleet: region eu (gateway gw-eu; engines eu-a-1 in zone eu-a, eu-b-1 in
eu-b) and region us (gateway gw-us; engine us-a-1), every one a real
process; BIND9 authoritative for `api.lifeline.test.` (answer 192.0.2.10
while eu serves, 198.51.100.10 for us), BIRD 2 observing both eu zones'
ExaBGP speakers announce the anycast prefix; a served control plane
(uvicorn, SQLite) with those daemons as its cutover drivers; and eu's agent
(the real `Agent` loop, probing eu's engines) reporting zone and region
faults to that control plane, which runs the escalation ladder. The agent
runs in the test process: a region's loss is seen from outside it, as a
prober in another region would see it (a drill killing the agent with its
region would leave nothing to detect the loss).

The drill's client resolves the name at BIND9 on every attempt (no cache)
and maps the address it gets to that region's gateway on loopback (the one
emulated step: TEST-NET addresses stand for the regions' front doors).

Promises measured: service and request recovery across a lost region
(every process of eu SIGKILLed, the record moved by the agent's region
fault → dns cutover, broken requests retried by the client through the
new answer; requests lost 0), and the return (processes restarted, the
cutover rolled back, the record back at BIND9). The zone drill at the
anycast tier: eu-a's engine SIGKILLed, the agent's zone fault withdraws
eu-a's path at BIRD (read back with birdc), the stream migrates to eu-b
token-identical, and the rollback re-announces it. Both check that
nothing outside the blast radius was touched (pids of every other
process, BIRD's path for the other zone, BIND9's record during the zone
drill).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from common.clock import SystemClock
from common import oneshot_http
from controlplane.app import create_app
from controlplane.auth import service as auth_service
from controlplane.auth.roles import Role
from controlplane.config import ControlPlaneSettings
from controlplane.db import build_engine, build_session_factory, session_scope
from controlplane.drill import measure, service
from controlplane.drill.errors import OutsideBlastRadius
from controlplane.drill.runner import DrillRunner, HttpEventReader
from controlplane.drill.schemas import DrillSpec
from controlplane.drill.states import DrillRunState
from controlplane.drill.tiers import AnycastObserver, DnsObserver, HttpCutovers
from controlplane.schema import upgrade
from controlplane.topology import service as topology
from controlplane.topology.schemas import ClusterCreate
from cutover.drivers.base import AnycastState, AnycastTarget
from cutover.drivers.anycast import AnycastDriver, BirdRouteReader, ExaBgpApi
from lifeline.daemons import BgpPeer, BindServer, BirdRouter, DnsRecord, ExaBgpSpeaker
from controlplane.replication import service as replication_service
from controlplane.replication.schemas import ReplicationPolicySpec
from lifeline.processes import EngineProcess, GatewayProcess, built_model, free_port, gateway_config
from tests.e2e.replication.conftest import Replication
from tests.support.controlplane_testing import throwaway_database
from tests.support.served_controlplane import serve_in_thread

pytestmark = pytest.mark.long  # scheduled first in its tier (tests/conftest.py)

ANSWERS = {"eu": "192.0.2.10", "us": "198.51.100.10"}
DNS_NAME = "api.lifeline.test."
PREFIX = "203.0.113.10/32"
PLACEMENT = {"eu-a-1": ("eu", "eu-a"), "eu-b-1": ("eu", "eu-b"), "us-a-1": ("us", "us-a")}
REDIS_URL = "redis://127.0.0.1:6379/0"
BLOCK = 16  # the engines' KV block (tokens)
# Sessions of class `chat` are critical (checkpointed every turn, nothing lost but the last partial block):
# the policy in the control plane's database (the Celery worker copies eu's store to us's by it) and, as the
# snapshot would carry it, in both gateways' static config.
CHAT_POLICY = {"model": "tiny", "session_class": "chat", "mode": "critical", "rpo_context_seconds": 30,
               "rpo_context_turns": 0}


class DnsTier:
    def __init__(self, bind: BindServer) -> None:
        self.bind = bind

    def observer(self, region: str) -> DnsObserver:
        return DnsObserver(self.bind.host, self.bind.port, DNS_NAME, [ANSWERS[region]])


class AnycastTier:
    def __init__(self, bird: BirdRouter, next_hops: dict[str, str]) -> None:
        self.reader = BirdRouteReader(bird.socket_path)
        self.next_hops = next_hops

    def observer(self, zone: str) -> AnycastObserver:
        return AnycastObserver(self.reader, PREFIX, self.next_hops, zone)


@dataclass
class TwoRegionFleet:
    """The drill's `Fleet` over real processes in two regions, with the dns and anycast tiers wired."""

    workdir: Path
    model: Path
    gateways: dict[str, GatewayProcess]
    bind: BindServer
    bird: BirdRouter
    speakers: dict[str, ExaBgpSpeaker]
    cutovers: HttpCutovers
    dns_tier: DnsTier
    anycast_tier: AnycastTier
    kv_stores: dict[str, str]  # region → its KV checkpoint store (engines write theirs, the worker copies)
    ports: dict[str, int] = field(default_factory=lambda: {i: free_port() for i in PLACEMENT})
    engines: dict[str, EngineProcess] = field(default_factory=dict)
    started: list[Any] = field(default_factory=list)
    region: str = "eu"  # the region the drills lose

    # -- Fleet ------------------------------------------------------------------------
    @property
    def gateway_url(self) -> str:
        return self.gateways["eu"].url

    @property
    def gateway_urls(self) -> list[str]:
        return [g.url for g in self.gateways.values()]

    def regions(self) -> list[str]:
        return sorted(self.gateways)

    def instance_ids(self) -> list[str]:
        return sorted(self.engines)

    def engine_url(self, instance_id: str) -> str:
        return self.engines[instance_id].url

    def served_model(self, instance_id: str) -> str:
        return self.model.name

    def zone_of(self, instance_id: str) -> str | None:
        return PLACEMENT[instance_id][1]

    def resolve_gateway(self) -> str:
        """What a client does: ask the name's authoritative server (BIND9), go to the region it answers."""
        [address, *_] = self.dns_tier.observer("eu").answer()
        region = next(r for r, a in ANSWERS.items() if a == address)
        return self.gateways[region].url

    def all_processes(self) -> dict[str, tuple[str, int | None]]:
        out: dict[str, tuple[str, int | None]] = {
            i: (PLACEMENT[i][0], _pid(e.process)) for i, e in self.engines.items()}
        out |= {f"gateway:{g.replica_id}": (r, _pid(g.process)) for r, g in self.gateways.items()}
        out |= {"tier:named": ("tier", _pid(self.bind.process)), "tier:bird": ("tier", _pid(self.bird.process))}
        out |= {f"tier:exabgp-{z}": ("tier", _pid(s.process)) for z, s in self.speakers.items()}
        return out

    def kill_process(self, name: str) -> None:
        if name.startswith("gateway:"):
            next(g for g in self.gateways.values() if f"gateway:{g.replica_id}" == name).kill(signal.SIGKILL)
        elif name in self.engines:
            self.engines[name].kill(signal.SIGKILL)
        else:
            raise AssertionError(f"a drill asked to kill {name}, which no region drill may touch")

    def kill(self, instance_id: str) -> None:
        self.engines[instance_id].kill(signal.SIGKILL)

    def restart(self, instance_id: str) -> None:
        self.engines[instance_id].kill(signal.SIGKILL)
        self.start_engines([instance_id])

    def restore_region(self, region: str) -> None:
        gateway = self.gateways[region]
        gateway.kill(signal.SIGKILL)
        gateway.start()
        self.started.append(gateway)
        gateway.wait_live()
        self.start_engines([i for i, (r, _) in PLACEMENT.items() if r == region])

    # -- building it --------------------------------------------------------------------
    def start_engines(self, instance_ids: list[str]) -> None:
        """Started together (a region's engines come back within a probe round or two of each other, so the
        agent does not take the first one back for a zone fault of the other), each on its own port."""
        new = []
        for instance_id in instance_ids:
            region, zone = PLACEMENT[instance_id]
            gateway = self.gateways[region]
            # Checkpoints only at sessions' key points (no mid-stream ones), into the region's own store.
            kv = ["--enable-kv-admin", "--kv-checkpoint-every", "1000000", "--kv-checkpoint-store",
                  self.kv_stores[region]]
            engine = EngineProcess(self.model, self.ports[instance_id], instance_id,
                                   self.workdir / "state" / instance_id,
                                   self.workdir / f"{instance_id}-{len(self.started)}.log",
                                   extra_args=[*gateway.registry_args(), "--enable-fault-admin", "--zone", zone,
                                               *kv])
            engine.start()
            self.started.append(engine)
            new.append((gateway, engine))
        for gateway, engine in new:
            engine.wait_ready()
            self.engines[engine.instance_id] = engine
        for region, gateway in self.gateways.items():
            gateway.wait_routable("tiny", sum(1 for i, (r, _) in PLACEMENT.items() if r == region))

    def close(self) -> None:
        for process in reversed(self.started):
            with contextlib.suppress(Exception):
                process.kill()


def _pid(process: Any) -> int | None:
    return process.pid if process is not None and process.poll() is None else None


# ---------------------------------------------------------------------------- the lab


@dataclass
class Lab:
    url: str
    factory: Any
    tokens: dict[str, str]
    fleet: TwoRegionFleet
    agent: Any
    replication: Replication


def _drivers(workdir: Path, bind: BindServer, bird: BirdRouter, speakers: dict[str, ExaBgpSpeaker],
             hops: dict[str, str]) -> Path:
    secret = workdir / "tsig.secret"
    secret.write_text(bind.key_secret)
    zones = "".join(f"""
[[anycast.zones]]
region = "eu"
zone = "{zone}"
next_hop = "{hops[zone]}"
command_fifo = "{s.command_fifo}"
ack_fifo = "{s.ack_fifo}"
""" for zone, s in speakers.items())
    path = workdir / "drivers.toml"
    # min_wait 2 s: the module's drills follow each other on the same scopes (the region's return may withdraw
    # eu-a, the zone drill then loses it), and the 5 min anti-flapping default would hold the next cutover.
    path.write_text(f"""
[policy]
min_wait = 2

[anycast]
prefix = "{PREFIX}"
birdc_socket = "{bird.socket_path}"
{zones}
[dns]
zone = "{bind.zone}"
name = "{DNS_NAME}"
ttl_s = 5
[dns.rfc2136]
server = "{bind.host}"
port = {bind.port}
key_name = "{bind.key_name}"
key_secret_file = "{secret}"
[dns.regions.eu]
answer = ["{ANSWERS['eu']}"]
failover_to = "us"
[dns.regions.us]
answer = ["{ANSWERS['us']}"]
failover_to = "eu"
""")
    return path


class AgentThread:
    """eu's agent: the real `Agent.tick` loop on its own event loop, reporting faults over HTTP."""

    def __init__(self, controlplane_url: str, token: str, engines: dict[str, str], version: str) -> None:
        from warm_pool.settings import AgentSettings

        # fault_rounds 8 × 0.25 s: engines restarted together come back within that of each other.
        self.settings = AgentSettings(
            region="eu", registry=REDIS_URL, registry_prefix=f"drill-{uuid.uuid4().hex[:8]}", lease_ttl=2.0,
            probe_interval=0.25, probe_timeout=1.0, fault_rounds=8, fault_clear_rounds=2,
            renew_leases_for=[{"url": url, "instance_id": i, "version": version, "zone": PLACEMENT[i][1]}
                              for i, url in engines.items()])
        self.controlplane_url, self.token = controlplane_url, token
        self.stop = threading.Event()
        self.ticks = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="agent-eu", daemon=True)

    async def _main(self) -> None:
        from contract.lease import RedisLeaseRegistry
        from warm_pool.agent import Agent
        from warm_pool.fault import FaultReporter

        registry = RedisLeaseRegistry.from_url(REDIS_URL, region="eu", prefix=self.settings.registry_prefix,
                                               ttl=self.settings.lease_ttl)
        http = httpx.AsyncClient(timeout=httpx.Timeout(1.0))
        cp = httpx.AsyncClient()
        agent = Agent(self.settings, registry=registry, http=http, clock=SystemClock(),
                      fault_reporter=FaultReporter(cp, self.controlplane_url, token=self.token))
        self.agent = agent
        try:
            while not self.stop.is_set():
                await agent.tick()
                self.ticks += 1
                await asyncio.sleep(self.settings.probe_interval.total_seconds())
        except BaseException as error:  # noqa: BLE001 - surfaced by the test
            self.error = error
        finally:
            await agent.close()
            await registry.close()
            await http.aclose()
            await cp.aclose()

    def alive(self) -> bool:
        return self.thread.is_alive() and self.error is None


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    workdir = tmp_path_factory.mktemp("drill-two-regions")
    clock = SystemClock()
    stoppers: list[Any] = []
    try:
        bind = BindServer(workdir=workdir / "bind", records=[DnsRecord("api", 5, "A", ANSWERS["eu"])]).start()
        stoppers.append(bind.stop)
        peers = {"eu-a": BgpPeer("eu_a", "127.0.0.2", 65002), "eu-b": BgpPeer("eu_b", "127.0.0.3", 65003)}
        bird = BirdRouter(workdir=workdir / "bird", peers=list(peers.values())).start()
        stoppers.append(bird.stop)
        speakers = {}
        for zone, peer in peers.items():
            speakers[zone] = ExaBgpSpeaker(workdir=workdir / f"exabgp-{zone}", peer=peer, router=bird).start()
            stoppers.append(speakers[zone].stop)
        hops = {zone: peer.address for zone, peer in peers.items()}
        announcer = AnycastDriver(speakers={z: ExaBgpApi(s.command_fifo, s.ack_fifo, ack_timeout_s=2.0)
                                            for z, s in speakers.items()},
                                  observer=BirdRouteReader(bird.socket_path))
        for zone, hop in hops.items():  # every serving zone announces, as at the start of a day
            state = AnycastState(target=AnycastTarget(prefix=PREFIX, zone=zone, next_hop=hop), announced=True)
            announcer.apply(state)
            assert announcer.verify(state, timedelta(seconds=15)).verified, f"BIRD never saw {zone}'s path"

        # PostgreSQL: the control plane and the replication worker and beat share it (the policies live there).
        database = throwaway_database("postgresql", workdir)
        url = database.__enter__()
        stoppers.append(lambda: database.__exit__(None, None, None))
        upgrade(url)
        settings = ControlPlaneSettings(database_url=url, data_dir=workdir, artifact_roots=[workdir],
                                        cutover_drivers_file=_drivers(workdir, bind, bird, speakers, hops))
        factory = build_session_factory(build_engine(url))
        tokens = {}
        with session_scope(factory) as session:
            for role in (Role.VIEWER, Role.OPERATOR, Role.AGENT):
                _, tokens[role.value] = auth_service.create_token(session, name=f"drill-{role.value}", role=role,
                                                                  created_by="test", clock=clock)
            for region, zones in (("eu", ("eu-a", "eu-b")), ("us", ("us-a",))):
                topology.create_region(session, name=region, description="", actor="test", clock=clock)
                for zone in zones:
                    topology.create_zone(session, region=region, name=zone, actor="test", clock=clock)
                    topology.create_cluster(session, spec=ClusterCreate(name=f"c-{zone}", region=region, zone=zone,
                                                                        model="tiny", weight=100),
                                            actor="test", clock=clock)
        cp_url, server, thread = serve_in_thread(create_app(settings))
        stoppers.append(lambda: (setattr(server, "should_exit", True), thread.join(timeout=10)))

        # Each region's KV store; eu's checkpoints reach us's by the real Celery worker and beat on RabbitMQ.
        kv_stores = {region: f"file://{workdir / f'kv-{region}'}" for region in ("eu", "us")}
        with session_scope(factory) as session:
            replication_service.put_policy(session, spec=ReplicationPolicySpec(
                **CHAT_POLICY, source_store=kv_stores["eu"], destination_store=kv_stores["us"],
                retention_seconds=3600, reason="drill lab"), actor="test", clock=clock)
        (workdir / "replication").mkdir()
        replication = Replication(workdir / "replication", url, env={})
        stoppers.append(replication.close)
        replication.start("worker")
        replication.start("beat")

        model = built_model("tiny", 0)
        gateways = {}
        for region in ("eu", "us"):
            sessions = {"store": str(workdir / f"sessions-{region}"), "policies": [{**CHAT_POLICY, "revision": 1}]}
            gateways[region] = GatewayProcess(gateway_config(model, recovery={"stall_timeout": 1.0},
                                                             sessions=sessions), free_port(),
                                              workdir / f"gw-{region}", replica_id=f"gw-{region}")
        fleet = TwoRegionFleet(workdir, model, gateways, bind, bird, speakers,
                               HttpCutovers(cp_url, tokens["operator"]), DnsTier(bind), AnycastTier(bird, hops),
                               kv_stores)
        stoppers.append(fleet.close)
        for gateway in gateways.values():
            gateway.start()
            fleet.started.append(gateway)
        for gateway in gateways.values():
            gateway.wait_live()
        fleet.start_engines(list(PLACEMENT))
        agent = AgentThread(cp_url, tokens["agent"], {i: fleet.engine_url(i) for i in PLACEMENT if i != "us-a-1"},
                            model.name)
        agent.thread.start()
        stoppers.append(lambda: (agent.stop.set(), agent.thread.join(timeout=10)))
        deadline = time.monotonic() + 60
        while not (getattr(agent, "agent", None) and len(agent.agent.faults.members) == 2):
            assert time.monotonic() < deadline and agent.alive(), f"the agent never saw eu's engines: {agent.error!r}"
            time.sleep(0.1)
        yield Lab(cp_url, factory, tokens, fleet, agent, replication)
    finally:
        for stop in reversed(stoppers):
            with contextlib.suppress(Exception):
                stop()


def define(lab: Lab, body: dict[str, Any]) -> int:
    clock = SystemClock()
    with session_scope(lab.factory) as session:
        definition = service.define(session, spec=DrillSpec.model_validate(body), actor="test", clock=clock)
        run = service.create_run(session, definition=definition, trigger="manual", actor="test", clock=clock)
        assert run.state == "awaiting_approval"  # zone and region drills need a person's approval
        service.approve(session, run_id=run.id, actor="operator:alice", clock=clock)
        return run.id


def runner(lab: Lab, tmp_path: Path) -> DrillRunner:
    return DrillRunner(factory=lab.factory, fleet=lab.fleet, clock=SystemClock(),
                       events=HttpEventReader(lab.url, lab.tokens["viewer"]), report_dir=tmp_path / "reports")


def pids(lab: Lab) -> dict[str, int | None]:
    return {name: pid for name, (_, pid) in lab.fleet.all_processes().items()}


REGION_DRILL = {
    "name": "lose-eu", "model": "tiny", "scope": "region", "fault": "region_loss", "expected_tier": "dns",
    "blast_radius": {"region": "eu", "zones": ["eu-a", "eu-b"], "instances": ["eu-a-1", "eu-b-1"],
                     "max_instances": 2},
    "stop_conditions": {"max_error_rate": 0.5},
    "targets": {"request_rto_s": 60.0, "rto_latency_s": 60.0, "ttft_target_ms": 2000.0, "rto_quality_s": 240.0,
                "ttft_window_s": 3.0, "ttft_window_min_samples": 3},
    "traffic": {"requests": 10, "concurrency": 2, "max_tokens": 16, "fault_after_tokens": 6,
                "token_delay_ms": 40.0, "fault_duration_s": 20.0, "retry_for_s": 90.0, "retry_backoff_s": 0.2},
}


def test_region_drill_loses_eu_and_lifeline_moves_the_record_at_bind9_then_returns_it(lab, tmp_path):
    fleet = lab.fleet
    before = pids(lab)
    eu = {n for n, (r, _) in fleet.all_processes().items() if r == "eu"}
    assert eu == {"eu-a-1", "eu-b-1", "gateway:gw-eu"}
    assert fleet.dns_tier.observer("eu").answer() == [ANSWERS["eu"]]
    paths_before = fleet.anycast_tier.observer("eu-a").announcing()

    outcome = runner(lab, tmp_path).run(define(lab, REGION_DRILL))
    report = outcome.report
    measured = report["measured"]
    assert outcome.state == DrillRunState.PASSED, report["follow_ups"]

    # Every process of eu was killed (by the pids it had), and nothing else.
    assert report["fault_details"]["processes_killed"] == {n: before[n] for n in sorted(eu)}
    after = pids(lab)
    assert all(after[n] == before[n] for n in before if n not in eu), (before, after)
    assert all(after[n] not in (None, before[n]) for n in eu)  # returned: new processes
    assert report["fault_details"]["outside_untouched"] == {n: True for n in before if n not in eu}
    # eu's engines come back one by one: a zone still down while the other serves is a zone fault the agent
    # reports (anycast withdraws it). Returning the region rolled each such cutover back; BIRD shows both again.
    inside = report["fault_details"]["cutover"]["inside"]
    assert all(c["tier"] == "anycast" and c["scope"].startswith("region:eu/zone:") for c in inside), inside
    assert report["fault_details"]["cutover"]["inside_rolled_back"] == [
        c["id"] for c in inside if c["state"] == "completed"]
    assert fleet.anycast_tier.observer("eu-a").announcing() == paths_before
    assert lab.agent.alive()

    # Lifeline cut over on its own: the agent's region fault → one automatic dns cutover, then rolled back.
    [cutover] = report["fault_details"]["cutover"]["cutovers"]
    assert (cutover["tier"], cutover["mode"]) == ("dns", "automatic")
    assert cutover["planned_by"].startswith("token:drill-agent#")
    assert report["fault_details"]["cutover"]["rolled_back"] == [cutover["id"]]
    assert fleet.dns_tier.observer("eu").answer() == [ANSWERS["eu"]]  # the record is eu's again
    dns_steps = [e for e in report["events"] if e["routing_tier"] == "dns"]
    assert dns_steps and all(e["scope"] == "region:eu" for e in dns_steps)
    routing = [e for e in report["events"] if e["routing_tier"]]
    assert report["routing_tiers_in_order"] == [
        e["routing_tier"] for e, (offset, _) in zip(routing, report["event_offsets"], strict=True)
        if measure.since_fault(offset, injection_s=report["fault_injection_s"])]
    assert [e["id"] for e in report["events"]] == sorted(e["id"] for e in report["events"])

    # Measured at the client, through BIND9's answer: the requests the fault broke were retried in us.
    assert measured["requests_lost"] == 0
    assert report["retried_requests"] >= 1
    moved = [row for row in report["timeline"] if fleet.gateways["us"].url in row["gateways"]]
    assert moved and all(row["error"] is None for row in moved)
    assert 0 < measured["detection_s"] <= measured["dns_moved_out_s"]  # the dns step began, then BIND9 answered us
    assert measured["request_rto_s"] > measured["detection_s"]  # no stream resumed before Lifeline acted
    assert measured["rto_latency_s"] is not None and measured["rto_latency_s"] > measured["detection_s"]
    assert measured["dns_moved_back_s"] is not None and measured["region_restored_s"] is not None
    assert report["rto_latency_window"]["window_s"] == 3.0 and report["rto_latency_window"]["min_samples"] == 3
    assert measured["rpo_context_tokens"] is None  # traffic without sessions measures no RPO_context
    assert "- `dns` " in Path(report["files"][0]).read_text()  # the Markdown report lists the dns events


# Multi-turn chat sessions, one at a time, so the fault lands in a known turn: the first session's third (two
# turns of 16 tokens reached the client, then 6 of the third), 3 s after the second ended (the client reading
# the answer; the worker copies that turn's checkpoint to us meanwhile). The broken turn is retried through
# BIND9's new answer at us, whose engine imports the replicated checkpoint. Target: the critical policy
# loses no turn, so at most the last partial block (BLOCK - 1 tokens) is re-prefilled.
SESSION_DRILL = {
    **REGION_DRILL, "name": "lose-eu-sessions",
    "targets": {**REGION_DRILL["targets"], "rpo_context_tokens": BLOCK - 1,
                # one turn every ~3.5 s: a 20 s window holds enough samples to say "within target"
                "ttft_window_s": 20.0, "ttft_window_min_samples": 3},
    "traffic": {**REGION_DRILL["traffic"], "requests": 3, "concurrency": 1, "fault_after_tokens": 2 * 16 + 6,
                "sessions": True, "session_turns": 4, "session_classes": ["chat"], "session_think_s": 3.0},
}


def test_region_drill_measures_rpo_context_of_multi_turn_sessions_resumed_at_the_standby(lab, tmp_path):
    fleet = lab.fleet
    assert fleet.dns_tier.observer("eu").answer() == [ANSWERS["eu"]]
    assert all(p.alive() for p in lab.replication.started)

    run_id = define(lab, SESSION_DRILL)
    outcome = runner(lab, tmp_path).run(run_id)
    report = outcome.report
    measured = report["measured"]
    assert outcome.state == DrillRunState.PASSED, report["follow_ups"]
    assert report["fault_details"]["cutover"]["cutovers"][0]["tier"] == "dns"

    # Every turn of every session token-identical to the undisturbed conversation (the only token RPO is what
    # a broken attempt had delivered and its retry at us delivered again); nothing lost.
    assert measured["requests_lost"] == 0 and report["retried_requests"] >= 1
    assert measured["token_rpo_tokens"] == report["tokens_redelivered_by_retry"] > 0
    turns = [row for row in report["timeline"] if row.get("session_id")]
    assert {row["turn"] for row in turns} == {0, 1, 2, 3}

    # The session in flight when eu was lost: its third turn, retried at us, re-prefilled only the last
    # partial block of its context (the checkpoint of turn 2's answer had reached us's store).
    resumed = {r["session_id"]: r for r in report["rpo_context_sessions"]}
    first = resumed[f"drill-{run_id}-0"]
    assert (first["turn"], first["session_class"]) == (2, "chat")
    assert first["context_recomputed_tokens"] == first["context_tokens"] % BLOCK
    assert first["cached_tokens"] == first["context_tokens"] // BLOCK * BLOCK > 0
    [row] = [r for r in turns if r["session_id"] == first["session_id"] and r["turn"] == 2]
    assert row["attempts"] > 1 and row["gateways"][-1] == fleet.gateways["us"].url
    for other in resumed.values():  # any other session resumed with context: the same rule
        assert other["context_recomputed_tokens"] == other["context_tokens"] % BLOCK, other
    worst = max(r["context_recomputed_tokens"] for r in resumed.values())
    assert measured["rpo_context_tokens"] == worst <= BLOCK - 1
    assert report["rpo_context_by_class"] == {"chat": worst}
    verdict = next(v for v in report["verdicts"] if v["metric"] == "rpo_context_tokens")
    assert (verdict["target"], verdict["met"]) == (BLOCK - 1, True)

    # The SLO document shows RPO_context as verified by this run.
    response = oneshot_http.get(f"{lab.url}/api/v1/slo/tiny", headers={"Authorization": f"Bearer {lab.tokens['viewer']}"},
                                timeout=10)
    assert response.status_code == 200, response.text
    figure = next(f for e in response.json()["triple"] for f in e["figures"] if f["metric"] == "rpo_context_tokens")
    assert (figure["status"], figure["run_id"], figure["measured"]) == ("measured", run_id, worst), figure
    print("RPO_context measured by the region drill:", report["rpo_context_sessions"])


ZONE_DRILL = {
    "name": "lose-eu-a-anycast", "model": "tiny", "scope": "zone", "fault": "zone_loss", "expected_tier": "anycast",
    "blast_radius": {"region": "eu", "zones": ["eu-a"], "max_instances": 1},
    "stop_conditions": {"max_error_rate": 0.5},
    "targets": {"request_rto_s": 30.0, "token_rpo_tokens": 0, "rto_quality_s": 180.0},
    "traffic": {"requests": 4, "concurrency": 2, "max_tokens": 24, "fault_after_tokens": 6, "token_delay_ms": 40.0},
}


def test_zone_drill_expecting_anycast_is_withdrawn_at_bird_and_announced_again(lab, tmp_path):
    fleet = lab.fleet
    before = pids(lab)
    assert fleet.anycast_tier.observer("eu-a").announcing() == ["eu-a", "eu-b"]

    outcome = runner(lab, tmp_path).run(define(lab, ZONE_DRILL))
    report = outcome.report
    assert outcome.state == DrillRunState.PASSED, report["follow_ups"]
    assert report["fault_details"]["instances_killed"] == ["eu-a-1"]
    [cutover] = report["fault_details"]["cutover"]["cutovers"]
    assert (cutover["tier"], cutover["mode"]) == ("anycast", "automatic")
    assert report["fault_details"]["cutover"]["rolled_back"] == [cutover["id"]]
    assert "anycast" in report["routing_tiers_in_order"]
    measured = report["measured"]
    assert measured["route_withdrawn_out_s"] is not None and measured["route_withdrawn_back_s"] is not None
    assert measured["token_rpo_tokens"] == 0 and measured["requests_lost"] == 0
    # Read back from BIRD: eu-a's path is announced again; eu-b's never left; the record never moved.
    assert fleet.anycast_tier.observer("eu-a").announcing() == ["eu-a", "eu-b"]
    assert fleet.dns_tier.observer("eu").answer() == [ANSWERS["eu"]]
    after = pids(lab)
    assert after["eu-a-1"] not in (None, before["eu-a-1"])
    assert all(after[n] == before[n] for n in before if n != "eu-a-1"), (before, after)


def test_region_drill_reaching_outside_its_blast_radius_is_refused_untouched(lab, tmp_path):
    before = pids(lab)
    body = {**REGION_DRILL, "name": "lose-eu-too-narrow",
            "blast_radius": {"region": "eu", "zones": ["eu-a"], "max_instances": 2}}  # eu-b would go too
    with pytest.raises(OutsideBlastRadius, match=r"zone\(s\) \['eu-b'\]"):
        runner(lab, tmp_path).run(define(lab, body))
    capped = {**REGION_DRILL, "name": "lose-eu-capped", "blast_radius": {"region": "eu", "max_instances": 1}}
    with pytest.raises(OutsideBlastRadius, match="cap of 1"):
        runner(lab, tmp_path).run(define(lab, capped))
    assert pids(lab) == before
    assert lab.fleet.dns_tier.observer("eu").answer() == [ANSWERS["eu"]]
