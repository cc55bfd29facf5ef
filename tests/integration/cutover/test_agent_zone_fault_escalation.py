"""A real agent sees a zone's engines SIGKILLed and escalates; the served control plane withdraws the zone at BIRD.

Real `lifeline engine serve` processes (one per zone of eu), the agent's
own loop on a real Redis registry, the control plane's app (`create_app`
with a drivers file, as `lifeline controlplane serve` builds it) reached
over httpx by the agent's `FaultReporter` with an `agent` token, the
anycast tier on real BIRD 2 + ExaBGP and the dns tier on a real BIND9.
A zone's engine SIGKILLed: the zone is withdrawn, once. Every engine
SIGKILLed: the region's record moves, and no zone fault is reported
beside it. Each cutover is automatic and its evidence names the
instances.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dns.message
import dns.query
import httpx
import pytest
from fastapi.testclient import TestClient

from common.clock import ManualClock, SystemClock
from contract.lease import RedisLeaseRegistry
from controlplane.app import create_app
from controlplane.auth import service as auth_service
from controlplane.auth.roles import Role
from controlplane.config import ControlPlaneSettings
from controlplane.db import session_scope
from controlplane.topology.lease import InMemoryLeaseReader
from lifeline.daemons import BindServer
from tests.integration.cutover.conftest import REGION_A, REGION_B, AnycastLab, dns_drivers_table
from tests.integration.cutover.test_cutover_support import topology_two_regions  # noqa: F401 - fixture
from tests.support.answer_contract import AnswerContract
from tests.support.waiting import until
from warm_pool.agent import Agent
from warm_pool.fault import FaultReporter
from warm_pool.settings import AgentSettings

pytestmark = [pytest.mark.usefixtures("topology_two_regions"), pytest.mark.long]

REDIS_URL = "redis://127.0.0.1:6379/0"
LAB_ZONE = {"eu-a": "zone-a", "eu-b": "zone-b"}


def _drivers_file(tmp_path: Path, lab: AnycastLab, dns: str = "") -> Path:
    zones = "".join(f"""
[[anycast.zones]]
region = "eu"
zone = "{zone}"
next_hop = "{lab.targets[name].next_hop}"
command_fifo = "{lab.speakers[name].command_fifo}"
ack_fifo = "{lab.speakers[name].ack_fifo}"
""" for zone, name in LAB_ZONE.items())
    path = tmp_path / "drivers.toml"
    path.write_text(f"""
[anycast]
prefix = "{lab.targets["zone-a"].prefix}"
birdc_socket = "{lab.router.socket_path}"
{zones}{dns}""")
    return path


@pytest.fixture
def served(settings: ControlPlaneSettings, clock: ManualClock, lease_reader: InMemoryLeaseReader, tmp_path: Path,
           anycast_lab: AnycastLab, bind_server: BindServer,
           session_factory: Any, answer_contract: AnswerContract) -> Iterator[TestClient]:
    configured = settings.model_copy(update={"cutover_drivers_file": _drivers_file(
        tmp_path, anycast_lab, dns_drivers_table(bind_server, tmp_path))})
    app = create_app(configured, clock=clock, lease_reader=lease_reader)
    with answer_contract.watch(TestClient(app, raise_server_exceptions=False)) as client:
        yield client


@pytest.fixture
def agent_token(session_factory: Any, clock: ManualClock) -> str:
    with session_scope(session_factory) as session:
        _, secret = auth_service.create_token(session, name="agent-eu", role=Role.AGENT, created_by="test",
                                              clock=clock)
    return secret


def _answer(bind: BindServer) -> list[str]:
    response = dns.query.udp(dns.message.make_query(f"api.{bind.zone}", "A"), bind.host, port=bind.port, timeout=2)
    return sorted(r.address for rrset in response.answer for r in rrset)


def _agent(served: TestClient, engines: dict[str, Any], token: str) -> tuple[Agent, Any]:
    settings = AgentSettings(
        region="eu", registry=REDIS_URL, registry_prefix=f"test-{uuid.uuid4().hex[:8]}", lease_ttl=2.0,
        probe_interval=0.25, probe_timeout=1.0, fault_rounds=3,
        renew_leases_for=[{"url": e.url, "instance_id": e.instance_id, "version": "tiny", "zone": zone}
                          for zone, e in engines.items()])
    registry = RedisLeaseRegistry.from_url(REDIS_URL, region="eu", prefix=settings.registry_prefix,
                                           ttl=settings.lease_ttl)
    http = httpx.AsyncClient(timeout=httpx.Timeout(1.0))
    cp = httpx.AsyncClient(transport=httpx.ASGITransport(app=served.app), base_url="http://cp")
    agent = Agent(settings, registry=registry, http=http, clock=SystemClock(),
                  fault_reporter=FaultReporter(cp, "http://cp", token=token))

    async def close() -> None:
        await agent.close()
        await registry.close()
        await http.aclose()
        await cp.aclose()

    return agent, close


@contextlib.asynccontextmanager
async def ticking(agent: Agent) -> Any:
    """The agent's loop for the test's duration, stopped by an event: a cancel alone can be swallowed by a
    health probe's `wait_for` on Python 3.11, and the loop then ticks on past the test (Agent.run_ticks)."""
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run_ticks(stop))
    try:
        yield
    finally:
        stop.set()
        await task


async def test_agent_escalates_a_zone_whose_engines_were_sigkilled_and_the_zone_is_withdrawn(
        served: TestClient, as_role: Any, agent_token: str, anycast_lab: AnycastLab, bind_server: BindServer,
        engine_factory: Any) -> None:
    engines = {zone: engine_factory(f"{zone}-1", extra_args=["--zone", zone]) for zone in LAB_ZONE}
    agent, close = _agent(served, engines, agent_token)
    viewer = as_role("viewer")
    try:
        async with ticking(agent):
            await until(lambda: len(agent.instances) == 2 and all(i.lease for i in agent.instances.values()),
                        "both engines leased by the agent")
            assert agent.faults.members.keys() == {"eu-a-1", "eu-b-1"}
            engines["eu-a"].kill()  # SIGKILL: the process is gone, eu-b serves on

            reported = await until(lambda: agent.status()["faults"]["reported"], "the zone fault reported")
            [(fault_id, outcome)] = reported.items()
            assert outcome == "accepted"
            [cutover] = served.get("/api/v1/cutovers", headers=viewer).json()
            assert (cutover["scope"], cutover["tier"], cutover["mode"], cutover["state"]) == (
                "region:eu/zone:eu-a", "anycast", "automatic", "completed")
            fault = cutover["evidence"]["fault"]
            assert fault["id"] == fault_id and fault["detector"] == "warm_pool.fault" and fault["rounds"] >= 3
            assert [(i["instance_id"], i["verdict"]) for i in fault["instances"]] == [("eu-a-1", "error")]
            assert fault["healthy_zones"] == {"eu-b": ["eu-b-1"]}
            assert cutover["planned_by"].startswith("token:agent-eu#")  # the agent's token, not a person's
            assert not anycast_lab.driver.read_state(anycast_lab.targets["zone-a"]).announced
            assert anycast_lab.driver.read_state(anycast_lab.targets["zone-b"]).announced

            # the fault persists: more rounds, no second report and no second cutover
            rounds = agent.metrics.probes.labels("error")._value.get()
            await until(lambda: agent.metrics.probes.labels("error")._value.get() >= rounds + 8, "eight more rounds")
            assert len(served.get("/api/v1/cutovers", headers=viewer).json()) == 1
            assert agent.metrics.fault_reports.labels("accepted")._value.get() == 1
            steps = served.get("/api/v1/events", params={"kind": "cutover.step", "routing_tier": "anycast"},
                               headers=viewer).json()
            assert [e["scope"] for e in steps] == ["region:eu/zone:eu-a"]
            assert _answer(bind_server) == [REGION_A]  # a zone fault never moves the region's record
    finally:
        await close()


async def test_agent_escalates_its_whole_region_down_to_dns_and_the_record_moves(
        served: TestClient, as_role: Any, agent_token: str, anycast_lab: AnycastLab, bind_server: BindServer,
        engine_factory: Any) -> None:
    engines = {zone: engine_factory(f"{zone}-1", extra_args=["--zone", zone]) for zone in LAB_ZONE}
    agent, close = _agent(served, engines, agent_token)
    viewer = as_role("viewer")
    try:
        async with ticking(agent):
            await until(lambda: len(agent.instances) == 2 and all(i.lease for i in agent.instances.values()),
                        "both engines leased by the agent")
            for engine in engines.values():  # both at once: one killed rounds before the other is a zone fault first
                engine.process.send_signal(signal.SIGKILL)
            for engine in engines.values():
                engine.kill()

            reported = await until(lambda: agent.status()["faults"]["reported"], "the region fault reported")
            assert list(reported.values()) == ["accepted"]
            found = served.get("/api/v1/cutovers", headers=viewer).json()
            assert len(found) == 1, [(c["scope"], c["state"], c["failure"]) for c in found]  # no zone fault beside
            [cutover] = found
            assert (cutover["scope"], cutover["tier"], cutover["mode"], cutover["state"]) == (
                "region:eu", "dns", "automatic", "completed")
            fault = cutover["evidence"]["fault"]
            assert fault["kind"] == "region" and sorted(i["instance_id"] for i in fault["instances"]) == [
                "eu-a-1", "eu-b-1"]
            assert _answer(bind_server) == [REGION_B]
            assert all(anycast_lab.driver.read_state(t).announced for t in anycast_lab.targets.values())
    finally:
        await close()


def test_an_agent_token_may_report_a_fault_and_call_nothing_else_of_the_cutover_api(
        served: TestClient, agent_token: str) -> None:
    agent = {"Authorization": f"Bearer {agent_token}"}
    denied = [("GET", "/api/v1/cutovers"), ("GET", "/api/v1/cutovers/1"), ("POST", "/api/v1/cutovers"),
              ("POST", "/api/v1/cutovers/1/execute"), ("POST", "/api/v1/cutovers/1/rollback"),
              ("POST", "/api/v1/cutovers/1/abort"), ("GET", "/api/v1/cutover-gate"), ("PUT", "/api/v1/cutover-gate"),
              ("GET", "/api/v1/zonal-shifts"), ("POST", "/api/v1/zonal-shifts"), ("DELETE", "/api/v1/zonal-shifts/1"),
              ("GET", "/api/v1/mesh-routes"), ("PUT", "/api/v1/mesh-routes")]
    for method, path in denied:
        response = served.request(method, path, headers=agent, json={})
        assert response.status_code == 403, (method, path, response.text)
    # past authorisation: a bad body is refused by validation, and changes nothing
    bad = served.post("/api/v1/cutover-escalations", headers=agent, json={"fault_id": "f", "evidence": {}})
    assert bad.status_code == 422
