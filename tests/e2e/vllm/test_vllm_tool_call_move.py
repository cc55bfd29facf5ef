"""Stock vLLM finishes a tool call another engine died writing: emitted once, whole, through the gateway.

The model is a real checkpoint whose weights answer one agent turn with
content and a Hermes-style `<tool_call>` (`tests/support/scripted_model.py`).
A reference engine, paced, starts the turn and is SIGKILLed K tokens in
(stock vLLM runs ahead of its client, so only a paced engine dies at a
chosen token of a 118-token answer); the gateway continues it on a real
vLLM from `prompt ‖ committed`, and vLLM's own kernels write the rest of the call
and the next one. The regional agent holds both leases in Redis, as in
production. Whatever K, the client gets vLLM's undisturbed tokens, each
call as exactly one `delta.tool_calls` entry and `finish_reason: "tool_calls"`.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from contract.lease import RedisLeaseReader
from lifeline.processes import EngineProcess, GatewayProcess, built_model, free_port, gateway_config
from lifeline.vllm import VllmProcess
from tests.e2e.gateway.test_gateway_tool_call_move import PATH, REQUEST, assert_calls
from tests.e2e.vllm.conftest import REDIS_URL, SERVED, routable_endpoints, stream, until
from tests.support import scripted_model

REGION = "r-vllm-tools"
# The victim's pace. A SIGKILL sent at the client's K-th token lands some tokens later (the gateway and the client
# lag the engine on two busy cores: at 100 ms a token, by up to 7); the test needs it to land inside the call.
TOKEN_DELAY_MS = 200


@dataclass
class MixedStack:
    vllm: VllmProcess
    gateway: GatewayProcess
    reader: RedisLeaseReader
    workdir: Path
    model: Path
    victim_port: int
    victim: EngineProcess | None = None

    def leased(self) -> dict[str, int]:
        return {lease.instance_id: lease.generation for lease in self.reader.list_instances(REGION)}

    def start_victim(self) -> EngineProcess:
        """A fresh reference engine on the victim's port, paced so that a kill lands within a token, leased anew."""
        previous = self.leased().get("victim", 0)
        if self.victim is not None:
            self.victim.kill()
        self.victim = EngineProcess(self.model, self.victim_port, "victim", self.workdir / "victim-state",
                                    self.workdir / "victim.log", extra_args=[
                                        "--served-model-name", SERVED, "--region", REGION, "--zone", "z2",
                                        "--fault-token-delay-ms", str(TOKEN_DELAY_MS)])
        self.victim.start()
        self.victim.wait_ready()
        until(lambda: self.leased().get("victim", 0) > previous, "the victim leased under a new generation", 60)
        until(lambda: routable_endpoints(self.gateway.url) == 2, "the gateway routing to the victim and the vLLM",
              60)
        return self.victim


@pytest.fixture(scope="module")
def turn(tmp_path_factory: pytest.TempPathFactory) -> scripted_model.ToolTurn:
    return scripted_model.build_tool_turn(built_model("tiny", 0), tmp_path_factory.mktemp("scripted") / "tool-turn")


@pytest.fixture(scope="module")
def stack(module_vllm_factory: Any, turn: scripted_model.ToolTurn,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[MixedStack]:
    workdir = tmp_path_factory.mktemp("mixed-stack")
    vllm = module_vllm_factory(SERVED, model=turn.model_dir, wait_ready=False)
    prefix, victim_port = f"test-{uuid.uuid4().hex[:8]}", free_port()
    config = workdir / "agent.yaml"
    config.write_text(yaml.safe_dump({
        "registry_prefix": prefix, "lease_ttl": 10.0, "probe_interval": 0.25, "probe_timeout": 5.0,
        "renew_leases_for": [{"url": vllm.url, "instance_id": "vllm", "version": SERVED, "zone": "z1"},
                             {"url": f"http://127.0.0.1:{victim_port}", "instance_id": "victim", "version": SERVED,
                              "zone": "z2"}]}))
    with open(workdir / "agent.log", "ab") as agent_log:
        agent = subprocess.Popen([sys.executable, "-m", "lifeline.cli", "agent", "serve", "--region", REGION,
                                  "--config", str(config), "--registry", REDIS_URL],
                                 stdout=agent_log, stderr=subprocess.STDOUT)
    gateway = GatewayProcess(gateway_config(turn.model_dir, alias=SERVED, version=SERVED, region=REGION, registry={
        "kind": "redis", "url": REDIS_URL, "key_prefix": prefix, "refresh_interval": 0.1, "ttl": 2.0},
        recovery={"stall_timeout": 2.0, "first_token_timeout": 30.0, "connect_timeout": 1.0}), free_port(), workdir)
    gateway.start()
    mixed = MixedStack(vllm, gateway, RedisLeaseReader.from_url(REDIS_URL, prefix=prefix), workdir, turn.model_dir,
                       victim_port)
    try:
        vllm.wait_ready()
        gateway.wait_live()
        until(lambda: "vllm" in mixed.leased(), "the agent leases the vLLM", 120)
        yield mixed
    finally:
        gateway.kill()
        if mixed.victim is not None:
            mixed.victim.kill()
        agent.terminate()
        agent.wait(30)


def test_vllm_alone_answers_the_scripted_turn_with_its_calls(stack: MixedStack,
                                                            turn: scripted_model.ToolTurn) -> None:
    result = stream(stack.gateway.url, PATH, REQUEST, prefer="vllm")
    assert_calls(result, turn)


@pytest.mark.parametrize("where", ["opening-tag", "inside-json", "closing-tag"])
def test_vllm_finishes_a_call_the_dead_engine_began(stack: MixedStack, turn: scripted_model.ToolTurn,
                                                    where: str) -> None:
    kill_at = {"opening-tag": turn.content_tokens + 1, "inside-json": turn.content_tokens + turn.call_tokens // 2,
               "closing-tag": turn.content_tokens + turn.call_tokens - 10}[where]
    victim = stack.start_victim()

    def on_token(count: int) -> None:  # SIGKILL from outside: the agent's probes also count the fault hook's tokens
        if count >= kill_at and victim.process is not None and victim.process.poll() is None:
            victim.kill()

    result = stream(stack.gateway.url, PATH, REQUEST, prefer="victim", on_token=on_token)
    assert victim.process is not None and victim.process.returncode == -9
    assert_calls(result, turn)
    served: dict[int, int] = {}
    for chunk in result.chunks:
        if chunk["choices"] and chunk["choices"][0].get("token_ids"):
            epoch = chunk["lifeline"]["epoch"]
            served[epoch] = served.get(epoch, 0) + len(chunk["choices"][0]["token_ids"])
    assert set(served) == {0, 1} and sum(served.values()) == len(turn.answer), served
    # The victim died at or after the client's K-th token, inside a call (the first, or the second where the
    # client lagged the engine by more than the rest of the first): vLLM wrote the rest of that call.
    calls = [range(turn.content_tokens + i * turn.call_tokens + 1, turn.content_tokens + (i + 1) * turn.call_tokens)
             for i in range(2)]
    assert served[0] >= kill_at and any(served[0] in call for call in calls), (served, calls)
