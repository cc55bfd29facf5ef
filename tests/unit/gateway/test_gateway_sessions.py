"""Session turns through a real StreamSession on scripted engines: the policy's key points, the context a
turn re-prefilled, and the checkpoint asked of the engine that served the turn (an httpx mock transport)."""

from __future__ import annotations

import json

import httpx
import pytest

from contract.kv_checkpoint import MemoryKVStore
from contract.session import CHECKPOINT_PARAM, SessionRecord, checkpoint_due
from contract.snapshot import ReplicationPolicyEntry
from gateway.engine_client import EngineToken
from gateway.errors import BadRequest
from gateway.schemas import CompletionRequest
from gateway.sessions import SessionKeeper, SessionTurn
from tests.unit.gateway.scripted import OPEN, Harness, frames_of

CRITICAL = {"model": "m", "session_class": "chat", "mode": "critical", "rpo_context_seconds": 5,
            "rpo_context_turns": 0, "revision": 1}


def policy(**fields) -> ReplicationPolicyEntry:
    return ReplicationPolicyEntry(**{**CRITICAL, **fields})


def record(**fields) -> SessionRecord:
    return SessionRecord(**{"session_id": "s", "model": "m", "session_class": "chat", "started_at": 100.0, **fields})


@pytest.mark.parametrize("entry, state, now, due", [
    (None, {"turns": 1}, 100.0, False),
    (policy(mode="rebuildable"), {"turns": 9}, 900.0, False),
    (policy(), {"turns": 1}, 100.0, True),
    (policy(), {"turns": 3, "checkpointed_turn": 3}, 100.0, False),  # nothing new since the checkpoint
    (policy(mode="interactive", every_turns=2), {"turns": 1}, 100.0, False),
    (policy(mode="interactive", every_turns=2), {"turns": 2}, 100.0, True),
    (policy(mode="interactive", every_turns=2), {"turns": 3, "checkpointed_turn": 2}, 100.0, False),
    (policy(mode="interactive", every_seconds=30), {"turns": 1}, 129.0, False),
    (policy(mode="interactive", every_seconds=30), {"turns": 1}, 130.0, True),  # since the first turn
    (policy(mode="interactive", every_seconds=30), {"turns": 4, "checkpointed_turn": 3, "checkpointed_at": 120.0},
     149.0, False),
    (policy(mode="interactive", every_turns=5, every_seconds=30),
     {"turns": 4, "checkpointed_turn": 3, "checkpointed_at": 120.0}, 150.0, True),  # whichever comes first
])
def test_checkpoint_due_follows_the_policys_key_points(entry, state, now, due):
    assert checkpoint_due(entry, record(**state), now=now) is due


@pytest.mark.parametrize("previous, context, continuity", [
    (None, 0, "here"),  # a session's first turn
    (record(turns=2, context_tokens=40), 40, "here"),
    (None, 40, "elsewhere"),  # the prompt carries context this region never recorded: a failover
])
def test_a_turn_whose_previous_turn_this_region_never_recorded_is_counted_elsewhere(previous, context, continuity):
    turn = SessionTurn("s", "chat", "m", policy(), previous, context, lambda ids, _: ids, cached_tokens=0)
    assert (turn.continuity, turn.figures()["continuity"]) == (continuity, continuity)


class FakeEngineAdmin:
    """The engines' answers to checkpointing completions: records each (url, checkpoint asked), answers as an
    engine with 4-token blocks (`contract.session.checkpoint_completion`)."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, dict]] = []
        self.fail = False

    def handler(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert (body["max_tokens"], body["stream"]) == (1, False)
        self.bodies.append((str(request.url), {"token_ids": body["prompt"], "model": body["model"],
                                               **body["kv_transfer_params"][CHECKPOINT_PARAM]}))
        if self.fail:
            return httpx.Response(503, json={"error": {"type": "kv_store_unavailable", "message": "down"}})
        tokens = len(body["prompt"]) // 4 * 4
        written = {"root_hash": "r", "last_hash": f"h{tokens}", "key": f"kv/r/manifests/h{tokens}.json",
                   "blocks": tokens // 4, "tokens": tokens, "computed_tokens": 0}
        return httpx.Response(200, json={"choices": [], "kv_transfer_params": {CHECKPOINT_PARAM: written}})


def harness(tiny_model, *entries: ReplicationPolicyEntry
            ) -> tuple[Harness, SessionKeeper, FakeEngineAdmin, MemoryKVStore]:
    h = Harness(tiny_model, ["a"], sessions={"policies": [e.model_dump() for e in entries]})
    admin = FakeEngineAdmin()
    store = MemoryKVStore()
    keeper = SessionKeeper(h.settings.sessions, h.router.table, h.metrics, h.clock, store=store,
                           http=httpx.AsyncClient(transport=httpx.MockTransport(admin.handler)))
    h.deps.sessions = keeper
    return h, keeper, admin, store


async def turn(h: Harness, keeper: SessionKeeper, prompt: list[int], answer: list[int], *, cached: int | None,
               headers: dict[str, str] | None = None) -> dict:
    """One completion turn of session `s1`; the usage frame's session figures."""
    body = CompletionRequest(model="m", prompt=prompt)
    version = h.router.table.resolve("m")
    opened = await keeper.open(headers or {"x-session-id": "s1", "x-session-class": "chat"}, body, version, prompt)
    h.engines.script("a", OPEN, EngineToken(answer[0], None, cached), *answer[1:-1], ("finish", answer[-1]))
    session = await h.session(max_tokens=len(answer), include_usage=True)
    session.request.prompt_ids = prompt
    session.turn = opened
    frames = await frames_of(session.run())
    await keeper.wait_recorded()
    [usage] = [f.usage for f in frames if f.kind == "usage"]
    assert usage.get("prompt_tokens_details") == (None if cached is None else {"cached_tokens": cached})
    return usage["lifeline_session"]


async def test_a_critical_session_is_checkpointed_after_every_turn_and_measures_what_it_recomputed(tiny_model):
    h, keeper, admin, _ = harness(tiny_model, policy())
    await h.register()
    first = await turn(h, keeper, [1, 2, 3], [5, 6], cached=0)
    assert (first["turn"], first["context_tokens"], first["context_recomputed_tokens"]) == (1, 0, 0)
    assert admin.bodies == [("http://a/v1/completions", {"token_ids": [1, 2, 3, 5, 6], "model": "v",
                                                         "request_id": "session:s1#turn:1", "session_class": "chat"})]

    # The next prompt starts with the last turn's prompt ‖ answer: that is its context; the engine restored 4.
    second = await turn(h, keeper, [1, 2, 3, 5, 6, 7, 8], [9, 10], cached=4)
    assert (second["turn"], second["context_tokens"], second["context_recomputed_tokens"]) == (2, 5, 1)
    assert [b["token_ids"] for _, b in admin.bodies][-1] == [1, 2, 3, 5, 6, 7, 8, 9, 10]
    stored = keeper.records.get("m", "s1")
    assert (stored.turns, stored.checkpointed_turn, stored.checkpointed_tokens, stored.context_tokens) == (2, 2, 8, 9)
    assert stored.checkpoint_key == "kv/r/manifests/h8.json"
    histogram = h.metrics.registry.get_sample_value
    assert (first["continuity"], second["continuity"]) == ("here", "here")
    assert histogram("lifeline_gateway_session_context_recomputed_tokens_sum",
                     {"session_class": "chat", "continuity": "here"}) == 1
    assert histogram("lifeline_gateway_session_checkpoints_total", {"session_class": "chat", "outcome": "written"}) == 2


async def test_an_interactive_session_is_checkpointed_every_n_turns_and_a_rebuildable_one_never(tiny_model):
    h, keeper, admin, _ = harness(tiny_model, policy(mode="interactive", every_turns=2),
                                  policy(session_class="system", mode="rebuildable"))
    await h.register()
    context: list[int] = [1, 2, 3]
    for n in range(1, 5):
        figures = await turn(h, keeper, context, [10 + n, 20 + n], cached=0)
        assert figures["mode"] == "interactive"
        context = [*context, 10 + n, 20 + n, 30 + n]
    assert [b["request_id"] for _, b in admin.bodies] == ["session:s1#turn:2", "session:s1#turn:4"]

    for _ in range(2):
        await turn(h, keeper, [1, 2, 3], [4, 5], cached=0, headers={"x-session-id": "s2", "x-session-class": "system"})
    assert len(admin.bodies) == 2 and keeper.records.get("m", "s2").turns == 2


async def test_a_failed_checkpoint_is_counted_and_the_session_goes_on_without_it(tiny_model):
    h, keeper, admin, _ = harness(tiny_model, policy())
    await h.register()
    admin.fail = True
    figures = await turn(h, keeper, [1, 2, 3], [5, 6], cached=None)
    assert figures["context_recomputed_tokens"] is None  # the engine did not say what it restored
    stored = keeper.records.get("m", "s1")
    assert (stored.turns, stored.checkpointed_turn, stored.checkpoint_key) == (1, 0, None)
    assert h.metrics.registry.get_sample_value("lifeline_gateway_session_checkpoints_total",
                                               {"session_class": "chat", "outcome": "failed"}) == 1


async def test_a_conversation_id_needs_a_user_and_a_bad_session_class_is_refused(tiny_model):
    h, keeper, _, _ = harness(tiny_model, policy())
    version = h.router.table.resolve("m")
    with pytest.raises(BadRequest, match="user"):
        await keeper.open({"x-conversation-id": "c1"}, CompletionRequest(model="m", prompt=[1]), version, [1])
    with pytest.raises(BadRequest, match="X-Session-Class"):
        await keeper.open({"x-session-id": "s", "x-session-class": "a/b"}, CompletionRequest(model="m", prompt=[1]),
                          version, [1])
    named = await keeper.open({"x-conversation-id": "c1"}, CompletionRequest(model="m", prompt=[1], user="u"),
                              version, [1])
    assert named is not None and (named.session_id, named.session_class, named.policy) == ("u/c1", "default", None)
    assert await keeper.open({}, CompletionRequest(model="m", prompt=[1]), version, [1]) is None
