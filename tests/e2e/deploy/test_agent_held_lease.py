"""The vLLM pod's lease path on CPU: an engine with no lease client, the agent's lease, a gateway, a SIGKILL.

deploy/ runs stock vLLM with no lease of its own: the region's agent
(`lifeline agent serve --renew-leases-for URL`) registers and renews one
from its probes, and the gateways route by the Redis registry. Here the
reference engine stands in for vLLM, started with its lease client off (no
`--registry`); the agent, the gateway and the engine are real processes on
the real Redis. Killing the engine must take it out of the registry and
out of the gateway's routing within the lease TTL (invariant 2); killing
the agent instead must let the lease lapse within the TTL too, since a
lease nobody renews means nothing vouches for the engine.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from common import oneshot_http
from contract.lease import RedisLeaseReader
from lifeline.processes import GatewayProcess, free_port, gateway_config
from tests.support.waiting import wait_for as until

REDIS_URL = "redis://127.0.0.1:6379/0"
REGION = "r-deploy"
LEASE_TTL_S = 2.0
PROBE_INTERVAL_S = 0.25
GATEWAY_REFRESH_S = 0.1


class Stack:
    """Redis lease keys of one test, a gateway routing by them, and the agent holding the engine's lease."""

    def __init__(self, tiny_model: Path, engine_url: str, workdir: Path) -> None:
        self.prefix = f"test-{uuid.uuid4().hex[:8]}"
        self.reader = RedisLeaseReader.from_url(REDIS_URL, prefix=self.prefix)
        self.gateway = GatewayProcess(gateway_config(tiny_model, region=REGION, registry={
            "kind": "redis", "url": REDIS_URL, "key_prefix": self.prefix, "refresh_interval": GATEWAY_REFRESH_S,
            "ttl": LEASE_TTL_S}), free_port(), workdir)
        config = workdir / "agent.yaml"
        config.write_text(yaml.safe_dump({"registry_prefix": self.prefix, "lease_ttl": LEASE_TTL_S,
                                          "probe_interval": PROBE_INTERVAL_S, "probe_timeout": 1.0}))
        self.agent_log = workdir / "agent.log"
        self._log = open(self.agent_log, "ab")  # noqa: SIM115
        self.gateway.start()
        self.agent = subprocess.Popen(
            [sys.executable, "-m", "lifeline.cli", "agent", "serve", "--region", REGION, "--config", str(config),
             "--registry", REDIS_URL, "--renew-leases-for", engine_url],
            stdout=self._log, stderr=subprocess.STDOUT)

    def leased(self) -> set[str]:
        return {lease.instance_id for lease in self.reader.list_instances(REGION)}

    def routable(self) -> int:
        try:
            body = oneshot_http.get(f"{self.gateway.url}/healthz/ready", timeout=1.0).json()
        except httpx.TransportError:
            return -1
        return body.get("routable_endpoints", {}).get("tiny", 0)

    def agent_alive(self) -> bool:
        assert self.agent.poll() is None, self.agent_log.read_text()[-3000:]
        return True

    def close(self) -> None:
        if self.agent.poll() is None:
            self.agent.terminate()
            self.agent.wait(30)
        self._log.close()
        self.gateway.kill()
        self.reader.redis.close()


@pytest.fixture
def stack_for(tiny_model: Path, tmp_path: Path) -> Iterator[Callable[[str], Stack]]:
    made: list[Stack] = []

    def make(engine_url: str) -> Stack:
        made.append(Stack(tiny_model, engine_url, tmp_path))
        return made[-1]

    yield make
    for stack in made:
        stack.close()


def start_leaseless_engine(engine_factory: Any, instance_id: str) -> Any:
    # No --registry: the engine's own lease client is off, as vLLM has none.
    engine = engine_factory(instance_id, extra_args=["--zone", "z1", "--region", REGION])
    assert "--registry" not in engine.extra_args
    return engine


def test_engine_without_a_lease_client_is_routed_by_the_agents_lease_and_leaves_within_the_ttl(
        engine_factory: Any, stack_for: Callable[[str], Stack]) -> None:
    engine = start_leaseless_engine(engine_factory, "vllm-standin")
    stack = stack_for(engine.url)
    until(lambda: stack.agent_alive() and stack.leased() == {"vllm-standin"}, "the agent registers the engine's lease")
    stack.gateway.wait_routable("tiny", 1)

    answer = oneshot_http.post(f"{stack.gateway.url}/v1/completions", timeout=60, json={
        "model": "tiny", "prompt": "The agent holds this lease", "max_tokens": 4, "temperature": 0.0})
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["text"]

    engine.kill(signal.SIGKILL)
    killed = time.monotonic()
    until(lambda: not stack.leased(), "the lease leaves the registry", timeout=10)
    unleased_s = time.monotonic() - killed
    until(lambda: stack.routable() == 0, "the gateway stops routing to the engine", timeout=10)
    unrouted_s = time.monotonic() - killed
    assert unleased_s <= LEASE_TTL_S, f"lease left the registry {unleased_s:.2f} s after the kill"
    # measured here: 0.17 s and 0.23 s (the agent releases on the first refused probe)
    assert unrouted_s <= LEASE_TTL_S + GATEWAY_REFRESH_S, f"gateway routed to it for {unrouted_s:.2f} s"
    stack.agent_alive()


def test_engine_leaves_routing_within_the_ttl_when_the_agent_holding_its_lease_dies(
        engine_factory: Any, stack_for: Callable[[str], Stack]) -> None:
    engine = start_leaseless_engine(engine_factory, "vllm-orphan")
    stack = stack_for(engine.url)
    until(lambda: stack.agent_alive() and stack.leased() == {"vllm-orphan"}, "the agent registers the engine's lease")
    stack.gateway.wait_routable("tiny", 1)

    stack.agent.send_signal(signal.SIGKILL)  # no release: the lease must lapse on its own
    stack.agent.wait(10)
    killed = time.monotonic()
    until(lambda: stack.routable() == 0, "the gateway stops routing to the unvouched engine", timeout=10)
    unrouted_s = time.monotonic() - killed
    # Lapsed, not released: the last renewal came at most a probe (interval + its round trip) before
    # the kill, and the gateway sees the expiry at its next refresh; 0.4 s of slack for this poll and
    # for scheduling on a loaded machine (measured here: 2.00 s).
    assert LEASE_TTL_S - 2 * PROBE_INTERVAL_S <= unrouted_s <= LEASE_TTL_S + GATEWAY_REFRESH_S + 0.4, (
        f"gateway stopped routing {unrouted_s:.2f} s after the agent died")
    assert not stack.leased()
    assert oneshot_http.get(f"{engine.url}/healthz/ready", timeout=5).status_code == 200  # the engine itself is fine
