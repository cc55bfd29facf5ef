"""The agent re-leases an engine that holds no lease of its own, and the gateway keeps serving it.

A reference engine started without `--registry` (as the pool's instances and
stock vLLM are) is leased by `lifeline agent serve --renew-leases-for`. Its
decode loop is stalled twice (`stall_step_after_tokens`): `/healthz/live`
turns 503 `decode_loop_stalled`, the agent releases the lease, and when the
step resumes it registers again under a new generation. Through a gateway on
the same Redis registry every request after each registration must come back
whole, with no `stale_generation` refusal: the engine leaves
`X-Lifeline-Generation` out when the lease is not its own.

The agent refuses a lease whose generation differs from the engine's only
when the engine sends `X-Lifeline-Generation` (a lease of its own); were it
to refuse this engine, the test fails with `AgentRefusedLease`.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import yaml

from common import oneshot_http
from contract.lease import RedisLeaseReader
from lifeline.processes import GatewayProcess, free_port, gateway_config
from tests.support.sse import StreamResult, stream_completion

REDIS_URL = "redis://127.0.0.1:6379/0"
REGION = "r-extgen"
BODY = {"model": "tiny", "prompt": "The agent holds this lease", "max_tokens": 12, "temperature": 0.0,
        "ignore_eos": True, "return_token_ids": True}


class AgentRefusedLease(AssertionError):
    """The agent released a lease because the engine's generation differs from it (warm_pool's workaround)."""


def until(condition: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    # The deadline bounds a broken test; nothing here asserts how fast anything is.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(0.05)
    raise AssertionError(f"never: {what}")


def test_agent_releases_and_registers_a_leaseless_engine_twice_without_stale_generation(
        engine_factory, tiny_model: Path, tmp_path: Path) -> None:
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    engine = engine_factory("ext-gen", extra_args=["--enable-fault-admin", "--step-stall-bound", "1",
                                                    "--zone", "z1", "--region", REGION])
    expected = oneshot_http.post(f"{engine.url}/v1/completions", json={**BODY, "model": tiny_model.name},
                                 timeout=60).json()["choices"][0]["token_ids"]
    gateway = GatewayProcess(gateway_config(tiny_model, region=REGION, registry={
        "kind": "redis", "url": REDIS_URL, "key_prefix": prefix, "ttl": 2.0, "token": "t"}),
        free_port(), tmp_path / "gw")
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({"registry_prefix": prefix, "lease_ttl": 2.0, "probe_interval": 0.5,
                                      "probe_timeout": 1.5, "snapshot_cache": str(tmp_path / "snapshot.json")}))
    agent_log = tmp_path / "agent.log"
    reader = RedisLeaseReader.from_url(REDIS_URL, prefix=prefix)
    gateway.start()
    with open(agent_log, "ab") as log:
        agent = subprocess.Popen([
            sys.executable, "-m", "lifeline.cli", "agent", "serve", "--region", REGION, "--config", str(config),
            "--registry", REDIS_URL, "--renew-leases-for", engine.url, "--port", "0"],
            stdout=log, stderr=subprocess.STDOUT)

    def generation() -> int | None:
        assert agent.poll() is None, agent_log.read_text()[-3000:]
        if "generations disagree" in agent_log.read_text():
            raise AgentRefusedLease(agent_log.read_text()[-2000:])
        leases = [lease for lease in reader.list_instances(REGION) if lease.instance_id == "ext-gen"]
        return leases[0].generation if leases else None

    def stall_until_released() -> threading.Thread:
        """Wedge the decode loop under a direct request: liveness fails, the agent lets the lease go."""
        oneshot_http.post(f"{engine.url}/admin/faults", json={"stall_step_after_tokens": 0}, timeout=5).raise_for_status()
        stuck: list[StreamResult] = []
        request = threading.Thread(target=lambda: stuck.append(
            stream_completion(engine.url, {**BODY, "model": tiny_model.name})))
        request.start()
        until(lambda: oneshot_http.get(f"{engine.url}/healthz/live", timeout=5).status_code == 503, "liveness fails")
        until(lambda: generation() is None, "the agent releases the stalled engine's lease")
        oneshot_http.post(f"{engine.url}/admin/faults", json={}, timeout=5).raise_for_status()
        return request

    try:
        gateway.wait_live()
        generations = [until(generation, "the agent leases the engine")]
        for _ in range(2):
            stuck = stall_until_released()
            generations.append(until(lambda: (g := generation()) is not None and g > generations[-1] and g,
                                     "the agent registers the lease again"))
            stuck.join(timeout=60)
            gateway.wait_routable("tiny", 1)
            for _ in range(3):
                assert generation() == generations[-1]
                result = stream_completion(gateway.url, BODY)
                assert result.error is None, result.error
                assert result.token_ids == expected and result.finish_reason == "length"
        assert generations == sorted(set(generations)) and len(generations) == 3
        assert gateway.metric("lifeline_gateway_migrations_total", {"reason": "stale_generation"}) == 0
        assert gateway.metric("lifeline_gateway_stale_frames_dropped_total") == 0
    finally:
        agent.terminate()
        agent.wait(30)
        gateway.kill()
        reader.redis.close()
        client = redis.Redis.from_url(REDIS_URL)
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)
