"""RPO_context measured on a lost region: sessions checkpointed by the primary's gateway, replicated by the
real Celery worker and beat on RabbitMQ, continued at the standby after the whole primary is SIGKILLed.

Two regions on real processes: each has a gateway (`lifeline gateway serve`) and an engine with its own KV
store (primary: a directory; standby: Redis). The replication policies live in the control plane's
PostgreSQL database (the worker copies by them); the gateways hold the same policies (routing.source
static: what the snapshot carries, `tests/integration/gateway/test_gateway_session_policy_snapshot.py`).

Three sessions of three chat turns each, one per class: `chat` (critical: every turn), `support`
(interactive: every 2 turns), `system` (rebuildable: never). After the last checkpoint reached the
standby store (or would never), the primary's gateway and engine are SIGKILLed and each session's fourth
turn goes to the standby's gateway. Measured, per class, from the response's `lifeline.session`:

- the answer is token-identical to an undisturbed run of the same conversation (greedy, float64);
- critical: the context re-prefilled is exactly the part of the last block the checkpoint could not
  hold (context mod 16): no turn lost, against a declared `rpo_context_turns` of 0;
- interactive: exactly what the newest replicated checkpoint (after turn 2) did not cover: one turn,
  against a declared `rpo_context_turns` of 1;
- rebuildable: the whole context;
- an engine with another block size reading the same standby store imports nothing (a miss, never a
  misuse) and still answers the same tokens.
"""

from __future__ import annotations

import signal
from typing import Any

from common import oneshot_http
from contract.kv_checkpoint import KVCheckpointStore, open_kv_store
from contract.session import SessionRecord, SessionStore
from lifeline.processes import GatewayProcess, free_port, gateway_config
from tests.e2e.replication.conftest import wait_for
from tests.e2e.replication.test_replication_celery import set_policy

BLOCK = 16
MAX_TOKENS = 24
MODEL = "tiny"
CLASSES = {
    "chat": {"mode": "critical", "rpo_context_seconds": 30, "rpo_context_turns": 0},
    "support": {"mode": "interactive", "every_turns": 2, "rpo_context_seconds": 300, "rpo_context_turns": 1},
    "system": {"mode": "rebuildable", "rpo_context_seconds": 0},
}
OPENERS = {
    "chat": "Our checkout service times out when the payment provider is slow; what should we look at first?",
    "support": "A customer in the northern region reports that invoices arrive twice since last Tuesday.",
    "system": "Summarise the runbook for rotating the database credentials without downtime, briefly.",
}
FOLLOW_UPS = ["Go on, with the next step.", "What would you measure to be sure?", "And if that fails too?"]


def body(messages: list[dict[str, str]]) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True}


def ask(url: str, messages: list[dict[str, str]], headers: dict[str, str] | None = None,
        path: str = "/v1/chat/completions", **extra: Any) -> dict[str, Any]:
    response = oneshot_http.post(url + path, json={**body(messages), **extra}, headers=headers or {}, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def conversation(opener: str, answers: list[str]) -> list[dict[str, str]]:
    """The messages of the turn after `answers`: opener, then each answer and the next follow-up."""
    messages = [{"role": "user", "content": opener}]
    for answer, follow_up in zip(answers, FOLLOW_UPS, strict=False):
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": follow_up}]
    return messages


def static_policies() -> list[dict[str, Any]]:
    """The policies as a snapshot carries them (contract.snapshot.ReplicationPolicyEntry)."""
    return [{"model": MODEL, "session_class": name, "revision": 1, **spec} for name, spec in CLASSES.items()]


def start_gateway(workdir, model, name: str, sessions_dir, static_policies: list[dict[str, Any]]) -> GatewayProcess:
    config = gateway_config(model, sessions={"store": str(sessions_dir), "policies": static_policies})
    gateway = GatewayProcess(config, free_port(), workdir, replica_id=name)
    gateway.start()
    gateway.wait_live()
    return gateway


def test_sessions_continue_at_the_standby_with_the_declared_rpo_context_after_the_primary_is_lost(
        engine_factory, tiny_model, replication, session_factory, store_urls, tmp_path):
    primary_url = f"file://{tmp_path / 'primary-kv'}"
    standby_url, _ = store_urls("redis", "standby")
    for name, spec in CLASSES.items():
        replicated = spec["mode"] != "rebuildable"
        set_policy(session_factory, name, primary_url if replicated else None, standby_url if replicated else None,
                   **spec)
    celery = replication()
    celery.start("worker")
    celery.start("beat")

    # The undisturbed run: the same conversations, four turns each, on an engine of its own.
    reference = engine_factory("reference")
    expected: dict[str, list[list[int]]] = {}
    texts: dict[str, list[str]] = {}
    for name, opener in OPENERS.items():
        expected[name], texts[name] = [], []
        for _ in range(4):
            answer = ask(reference.url, conversation(opener, texts[name]), model=tiny_model.name)["choices"][0]
            expected[name].append(answer["token_ids"])
            texts[name].append(answer["message"]["content"])

    # One region each: a gateway, and an engine checkpointing only at sessions' key points.
    static = static_policies()
    gateways: list[GatewayProcess] = []
    try:
        primary_gw = start_gateway(tmp_path, tiny_model, "gateway-primary", tmp_path / "sessions-primary", static)
        gateways.append(primary_gw)
        standby_gw = start_gateway(tmp_path, tiny_model, "gateway-standby", tmp_path / "sessions-standby", static)
        gateways.append(standby_gw)
        no_mid_stream = ["--enable-kv-admin", "--kv-checkpoint-every", "1000000"]
        primary_engine = engine_factory("primary-1", extra_args=[
            *primary_gw.registry_args(), *no_mid_stream, "--kv-checkpoint-store", primary_url])
        engine_factory("standby-1", extra_args=[
            *standby_gw.registry_args(), *no_mid_stream, "--kv-checkpoint-store", standby_url])
        primary_gw.wait_routable(MODEL, 1)
        standby_gw.wait_routable(MODEL, 1)

        records = SessionStore(open_kv_store(str(tmp_path / "sessions-primary")))
        for name, opener in OPENERS.items():
            headers = {"X-Session-Id": f"session-{name}", "X-Session-Class": name}
            for turn in range(3):
                answer = ask(primary_gw.url, conversation(opener, texts[name][:turn]), headers)
                assert answer["choices"][0]["token_ids"] == expected[name][turn], (name, turn)
                assert answer["choices"][0]["message"]["content"] == texts[name][turn], (name, turn)
                assert answer["lifeline"]["session"]["turn"] == turn + 1

        def recorded(name: str) -> SessionRecord | None:
            record = records.get(MODEL, f"session-{name}")
            return record if record is not None and record.turns == 3 else None

        last = {name: wait_for(lambda name=name: recorded(name), f"{name}'s third turn recorded") for name in CLASSES}
        assert [last[n].checkpointed_turn for n in CLASSES] == [3, 2, 0]  # every turn, every 2, never
        standby = KVCheckpointStore(open_kv_store(standby_url))
        for name in ("chat", "support"):
            wait_for(lambda name=name: last[name].checkpoint_key in standby.manifests(),
                     f"{name}'s newest checkpoint replicated to the standby", timeout=90)

        # The primary region is lost: its gateway and its engine, at once.
        primary_engine.kill(signal.SIGKILL)
        primary_gw.kill(signal.SIGKILL)

        measured: dict[str, dict[str, Any]] = {}
        for name, opener in OPENERS.items():
            headers = {"X-Session-Id": f"session-{name}", "X-Session-Class": name}
            answer = ask(standby_gw.url, conversation(opener, texts[name][:3]), headers)
            assert answer["choices"][0]["token_ids"] == expected[name][3], name  # token-identical
            measured[name] = answer["lifeline"]["session"]
            assert measured[name]["context_tokens"] == last[name].context_tokens, name

        chat, support, system = measured["chat"], measured["support"], measured["system"]
        assert chat["context_recomputed_tokens"] == chat["context_tokens"] % BLOCK  # no turn lost
        assert chat["cached_tokens"] == chat["context_tokens"] // BLOCK * BLOCK
        # Interactive: the checkpoint after turn 2 is the newest; turn 3's context is re-prefilled.
        assert support["context_recomputed_tokens"] == support["context_tokens"] - last["support"].checkpointed_tokens
        assert support["context_recomputed_tokens"] > chat["context_recomputed_tokens"]
        assert system["context_recomputed_tokens"] == system["context_tokens"]  # rebuildable: all of it
        recomputed = sum(m["context_recomputed_tokens"] for m in measured.values())
        assert all(m["continuity"] == "elsewhere" for m in measured.values())  # the standby never saw them
        assert standby_gw.metric("lifeline_gateway_session_context_recomputed_tokens_sum",
                                 {"continuity": "elsewhere"}) == recomputed

        # Another block size reads the same standby store: a miss, never a misuse; the same tokens.
        other = engine_factory("standby-block8", extra_args=["--kv-block-tokens", "8", "--kv-checkpoint-store",
                                                              standby_url, "--kv-checkpoint-every", "1000000"])
        answer = ask(other.url, conversation(OPENERS["chat"], texts["chat"][:3]), model=tiny_model.name)
        assert answer["choices"][0]["token_ids"] == expected["chat"][3]
        assert answer["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        print("RPO_context measured (context tokens re-prefilled at the standby):",
              {name: (m["context_recomputed_tokens"], m["context_tokens"]) for name, m in measured.items()})
    finally:
        for gateway in gateways:
            gateway.kill()
