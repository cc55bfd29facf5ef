"""RPO_context measured on a lost region for sessions over /v1/completions: their records replicated with their
KV by the real Celery worker and beat on RabbitMQ, so the standby's gateway knows each session's turns and
context after the whole primary is SIGKILLed.

Chat sessions carry their context in the request (the standby renders the conversation); a completion's
context is known only from the session record (the previous turn's `prompt ‖ answer`). Here each region's
gateways keep their records in the region's KV store (`sessions.store` = the engines'
`--kv-checkpoint-store`: primary a directory, standby Redis), where the policy's sweep finds them beside the
checkpoints (controlplane/replication/session_records.py).

Two sessions of three completion turns each (token-id prompts: turn n+1's prompt is turn n's prompt, its
answer and a follow-up), one per class: `chat` (critical: every turn) and `support` (interactive: every 2
turns). Once each session's third-turn record is at the standby whole (its checkpoint there too), the
primary's gateway and engine are SIGKILLed and each session's fourth turn goes to the standby's gateway:

- the answer is token-identical to an undisturbed run (greedy, float64);
- the standby's gateway knows the session: turn 4, the record's context, counted `elsewhere`;
- critical: the context re-prefilled is what the last block could not hold (context mod 16);
  interactive: what turn 2's checkpoint did not cover (turn 3); the elsewhere histogram sums them;
- the interactive cadence goes on from the replicated record (turn 4 is a key point: 2 turns after
  turn 2's checkpoint) rather than restarting, and the sweeps that follow never replace the record the
  standby's gateway wrote with the primary's older one.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from common import oneshot_http
from contract.kv_checkpoint import KVCheckpointStore, open_kv_store
from contract.session import SessionRecord, SessionStore
from lifeline.processes import GatewayProcess, free_port, gateway_config, scrape_metric
from tests.e2e.kv.conftest import prompt_ids
from tests.e2e.replication.conftest import wait_for
from tests.e2e.replication.test_replication_celery import set_policy, status_of

BLOCK = 16
MAX_TOKENS = 24
MODEL = "tiny"
CLASSES = {
    "chat": {"mode": "critical", "rpo_context_seconds": 30, "rpo_context_turns": 0},
    "support": {"mode": "interactive", "every_turns": 2, "rpo_context_seconds": 300, "rpo_context_turns": 1},
}
OPENERS = {
    "chat": "Incident log, checkout service. The payment provider answers slowly and requests time out; first,",
    "support": "Ticket 4411. A customer in the northern region receives every invoice twice since Tuesday; so far,",
}
FOLLOW_UPS = [" Next,", " To be sure, we measured", " If that fails too,"]


def complete(url: str, prompt: list[int], headers: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    response = oneshot_http.post(f"{url}/v1/completions", headers=headers or {}, timeout=120, json={
        "model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True,
        "return_token_ids": True, **extra})
    assert response.status_code == 200, response.text
    return response.json()


def start_gateway(workdir: Path, model: Path, name: str, sessions_store: str) -> GatewayProcess:
    policies = [{"model": MODEL, "session_class": c, "revision": 1, **spec} for c, spec in CLASSES.items()]
    config = gateway_config(model, sessions={"store": sessions_store, "policies": policies})
    gateway = GatewayProcess(config, free_port(), workdir, replica_id=name)
    gateway.start()
    gateway.wait_live()
    return gateway


def test_completion_sessions_are_known_at_the_standby_and_measure_their_rpo_context_after_the_primary_is_lost(
        engine_factory, tiny_model, replication, session_factory, store_urls, tmp_path):
    primary_url = f"file://{tmp_path / 'primary-kv'}"
    standby_url, _ = store_urls("redis", "standby")
    for name, spec in CLASSES.items():
        set_policy(session_factory, name, primary_url, standby_url, **spec)
    celery = replication()
    worker = celery.start("worker")
    celery.start("beat")

    # The undisturbed run, on an engine of its own: each turn's prompt and answer.
    reference = engine_factory("reference")
    tokenizer = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    follow_ups = [tokenizer.encode(text, add_special_tokens=False).ids for text in FOLLOW_UPS]
    prompts: dict[str, list[list[int]]] = {}
    answers: dict[str, list[list[int]]] = {}
    for name, opener in OPENERS.items():
        prompts[name], answers[name] = [prompt_ids(reference, opener)], []
        for turn in range(4):
            answer = complete(reference.url, prompts[name][turn], model=tiny_model.name)["choices"][0]["token_ids"]
            answers[name].append(answer)
            if turn < 3:
                prompts[name].append([*prompts[name][turn], *answer, *follow_ups[turn]])

    gateways: list[GatewayProcess] = []
    try:
        primary_gw = start_gateway(tmp_path, tiny_model, "gateway-primary", primary_url)
        gateways.append(primary_gw)
        standby_gw = start_gateway(tmp_path, tiny_model, "gateway-standby", standby_url)
        gateways.append(standby_gw)
        no_mid_stream = ["--enable-kv-admin", "--kv-checkpoint-every", "1000000"]
        primary_engine = engine_factory("primary-1", extra_args=[
            *primary_gw.registry_args(), *no_mid_stream, "--kv-checkpoint-store", primary_url])
        engine_factory("standby-1", extra_args=[
            *standby_gw.registry_args(), *no_mid_stream, "--kv-checkpoint-store", standby_url])
        primary_gw.wait_routable(MODEL, 1)
        standby_gw.wait_routable(MODEL, 1)

        for name in CLASSES:
            headers = {"X-Session-Id": f"completion-{name}", "X-Session-Class": name}
            for turn in range(3):
                answer = complete(primary_gw.url, prompts[name][turn], headers)
                assert answer["choices"][0]["token_ids"] == answers[name][turn], (name, turn)
                assert answer["lifeline"]["session"]["turn"] == turn + 1

        primary_records = SessionStore(open_kv_store(primary_url))
        standby_records = SessionStore(open_kv_store(standby_url))
        standby = KVCheckpointStore(open_kv_store(standby_url))

        def third_turn(records: SessionStore, name: str) -> SessionRecord | None:
            record = records.get(MODEL, f"completion-{name}")
            return record if record is not None and record.turns == 3 else None

        last = {name: wait_for(lambda name=name: third_turn(primary_records, name), f"{name}'s third turn recorded")
                for name in CLASSES}
        assert [last[n].checkpointed_turn for n in CLASSES] == [3, 2]  # every turn, every 2
        for name in CLASSES:  # replicated whole: the record and the checkpoint it claims
            replica = wait_for(lambda name=name: (r := third_turn(standby_records, name)) is not None
                               and r.checkpoint_key == last[name].checkpoint_key and r,
                               f"{name}'s record replicated whole", timeout=90)
            assert replica.replicated_at is not None
            assert replica.model_copy(update={"replicated_at": None}) == last[name]
            assert last[name].checkpoint_key in standby.manifests()

        # The primary region is lost: its gateway and its engine, at once.
        primary_engine.kill(signal.SIGKILL)
        primary_gw.kill(signal.SIGKILL)

        measured: dict[str, dict[str, Any]] = {}
        for name in CLASSES:
            headers = {"X-Session-Id": f"completion-{name}", "X-Session-Class": name}
            answer = complete(standby_gw.url, prompts[name][3], headers)
            assert answer["choices"][0]["token_ids"] == answers[name][3], name  # token-identical
            measured[name] = answer["lifeline"]["session"]
            assert (measured[name]["turn"], measured[name]["continuity"]) == (4, "elsewhere"), name
            assert measured[name]["context_tokens"] == last[name].context_tokens == \
                len(prompts[name][2]) + len(answers[name][2])

        chat, support = measured["chat"], measured["support"]
        assert chat["context_recomputed_tokens"] == chat["context_tokens"] % BLOCK  # no turn lost
        assert support["context_recomputed_tokens"] == support["context_tokens"] - last["support"].checkpointed_tokens
        assert support["context_recomputed_tokens"] > chat["context_recomputed_tokens"]  # turn 3 re-prefilled
        recomputed = chat["context_recomputed_tokens"] + support["context_recomputed_tokens"]
        assert standby_gw.metric("lifeline_gateway_session_context_recomputed_tokens_sum",
                                 {"continuity": "elsewhere"}) == recomputed

        # The standby's cadence goes on from the replicated record: turn 4 is the interactive key point.
        def fourth_turn(name: str) -> SessionRecord | None:
            record = standby_records.get(MODEL, f"completion-{name}")
            return record if record is not None and record.turns == 4 else None

        own = wait_for(lambda: fourth_turn("support"), "support's fourth turn recorded at the standby")
        assert (own.replicated_at, own.checkpointed_turn) == (None, 4)
        swept = status_of(session_factory, "support")["last_sweep_at"]
        for _ in range(2):  # sweeps after it never put the primary's older record back
            wait_for(lambda: status_of(session_factory, "support")["last_sweep_at"] != swept, "another sweep")
            swept = status_of(session_factory, "support")["last_sweep_at"]
        assert fourth_turn("support") == own

        page = f"http://127.0.0.1:{worker.metrics_port}/metrics"
        for name in CLASSES:
            labels = {"model": MODEL, "session_class": name}
            assert scrape_metric(page, "lifeline_replication_session_records_total",
                                 {**labels, "outcome": "replicated"}) >= 1
            assert scrape_metric(page, "lifeline_replication_session_record_lag_seconds_count", labels) >= 1
        print("RPO_context measured over /v1/completions (context tokens re-prefilled at the standby):",
              {name: (m["context_recomputed_tokens"], m["context_tokens"]) for name, m in measured.items()})
    finally:
        for gateway in gateways:
            gateway.kill()
