"""A tool call the model is writing when its engine dies is emitted once, whole, by the engine that finishes it.

The engines are real reference engines running a real transformer whose
weights were chosen to answer one agent turn (`tests/support/scripted_model.py`):
some content, then two Hermes-style `<tool_call>`s with JSON inside, then
EOS. The victim exits after K tokens (`--fault-exit-after-tokens`), for K
before the first call, at its opening tag, inside its JSON, inside its
closing tag and between the two; the gateway continues the stream on the
survivor from `prompt ‖ committed`. Whatever K, the client gets the
undisturbed run's tokens, the content unchanged, each call as exactly one
`delta.tool_calls` entry, `finish_reason: "tool_calls"` and one migration.
A client that hangs up inside a call and resumes with `Last-Event-ID` gets
it once too; `parallel_tool_calls: false` gets the first call only.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from lifeline.processes import built_model, gateway_config
from tests.e2e.gateway.conftest import Cluster, StreamResult, resume, stream
from tests.support import scripted_model

REQUEST = {"model": "tiny", "messages": scripted_model.MESSAGES, "tools": scripted_model.TOOLS, "temperature": 0.0,
           "max_tokens": 200, "return_token_ids": True}
PATH = "/v1/chat/completions"


@pytest.fixture(scope="module")
def turn(tmp_path_factory: pytest.TempPathFactory) -> scripted_model.ToolTurn:
    return scripted_model.build_tool_turn(built_model("tiny", 0), tmp_path_factory.mktemp("scripted") / "tool-turn")


@pytest.fixture(scope="module")
def cluster(cluster_factory: Any, turn: scripted_model.ToolTurn) -> Cluster:
    c = cluster_factory()
    c.model = turn.model_dir
    c.start_gateway(gateway_config(c.model, recovery={"stall_timeout": 1.0}))
    c.start_engine("survivor")
    c.gateway.wait_routable("tiny", 1)
    return c


def said(result: StreamResult) -> tuple[str, list[dict[str, Any]]]:
    """The content and every tool-call delta entry the client was sent, in order."""
    content, calls = [], []
    for chunk in result.chunks:
        for choice in chunk["choices"]:
            delta = choice.get("delta", {})
            content.append(delta.get("content") or "")
            calls.extend(delta.get("tool_calls") or [])
    return "".join(content), calls


def assert_calls(result: StreamResult, turn: scripted_model.ToolTurn, count: int = 2) -> None:
    """The undisturbed answer: its tokens, its content, and its first `count` calls, each sent once, whole."""
    assert result.error is None, result.error
    assert result.done and result.finish_reason == "tool_calls"
    assert result.token_ids == turn.answer  # EOS last, as engines report the token that stopped them
    assert result.seqs == list(range(len(result.seqs)))
    content, calls = said(result)
    assert content == scripted_model.CONTENT
    assert [(c["index"], c["type"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] \
        == [(i, "function", call["name"], call["arguments"]) for i, call in enumerate(scripted_model.CALLS[:count])]
    assert len({c["id"] for c in calls}) == count and all(c["id"].startswith("call_") for c in calls)


def test_the_scripted_turn_undisturbed_is_content_then_two_calls(cluster: Cluster,
                                                                turn: scripted_model.ToolTurn) -> None:
    result = stream(cluster.gateway.url, REQUEST, path=PATH)
    assert_calls(result, turn)
    assert max(result.epochs) == 0


@pytest.mark.parametrize("where", ["before-call", "opening-tag", "inside-json", "closing-tag", "between-calls"])
def test_a_call_cut_by_an_engine_kill_is_emitted_once_whole(cluster: Cluster, turn: scripted_model.ToolTurn,
                                                            where: str) -> None:
    kill_after = {"before-call": turn.content_tokens - 2, "opening-tag": turn.content_tokens + 2,
                  "inside-json": turn.content_tokens + turn.call_tokens // 2,
                  "closing-tag": turn.content_tokens + turn.call_tokens - 3,
                  "between-calls": turn.content_tokens + turn.call_tokens}[where]
    for engine in cluster.engines:
        if engine.instance_id == "victim":
            engine.kill()
    previous = cluster.gateway.leases().get("victim", 0)
    victim = cluster.start_engine("victim", ["--fault-exit-after-tokens", str(kill_after)])
    cluster.gateway.wait_generation_above("victim", previous)
    before = cluster.gateway.metric("lifeline_gateway_migrations_total")

    result = stream(cluster.gateway.url, REQUEST, {"X-Lifeline-Prefer-Instance": "victim"}, path=PATH)

    victim.process.wait(timeout=30)
    assert victim.process.returncode == 137  # the fault really killed it, K tokens in
    assert_calls(result, turn)
    assert cluster.gateway.metric("lifeline_gateway_migrations_total") - before == 1
    from_victim = [c for c in result.chunks if c["lifeline"]["epoch"] == 0 and c["choices"]
                   and c["choices"][0].get("token_ids")]
    assert len(from_victim) == kill_after


def test_a_client_that_hangs_up_inside_the_call_gets_it_once_on_resume(cluster: Cluster,
                                                                       turn: scripted_model.ToolTurn) -> None:
    # The role event, the content's frames, and half the first call's: then the client leaves.
    first = stream(cluster.gateway.url, REQUEST, path=PATH, stop_after=1 + turn.content_tokens + turn.call_tokens // 2)
    assert said(first)[1] == []  # the call's closing tag had not come: nothing of it was sent
    assert first.request_id is not None
    rest = resume(cluster.gateway.url, first.request_id, first.seqs[-1])
    whole = StreamResult(first.events + rest.events, first.chunks + rest.chunks, first.token_ids + rest.token_ids,
                         first.seqs + rest.seqs, first.epochs + rest.epochs, rest.finish_reason, rest.error, rest.done,
                         first.request_id)
    assert_calls(whole, turn)


def test_parallel_tool_calls_false_sends_the_first_call_only(cluster: Cluster, turn: scripted_model.ToolTurn) -> None:
    """As vLLM does: the model still writes both, the second is read and dropped (neither a call nor content)."""
    result = stream(cluster.gateway.url, {**REQUEST, "parallel_tool_calls": False}, path=PATH)
    assert_calls(result, turn, count=1)
