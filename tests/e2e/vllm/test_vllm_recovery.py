"""Streams through the gateway survive a real vLLM's death, token-identically: greedy and seeded, both APIs.

Each round pins five streams to one vLLM (greedy and seeded, completions
and chat, and a chat turn with tools and a tool call in its history), kills that vLLM once the first of them has a few tokens (the
others may have fewer, or none yet: a kill before the first token), checks
each stream against the same request run undisturbed: the exact token ids,
each sequence number once, ended by the model (`length`), and moved
(`epoch` > 0). The victim is started again in the background and the next
round kills the other one, so the rounds cross engines both ways.

SIGKILL is a lost node. SIGTERM is every rolling update: the servers here
drain for only 1 s (`--shutdown-timeout 1`), so vLLM cuts the streams off
mid-way — with `finish_reason: "abort"` or by going silent — and the
gateway must continue them elsewhere rather than hand the client a
truncated answer. Seeded streams are identical because both vLLMs load
Lifeline's position-keyed sampler (`lifeline_vllm.sampler`); a test below
checks that sampler against the reference engine's own draws.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from common import oneshot_http
from contract.sampling import Sampling, identify_request, sampling_from_answer
from tests.e2e.vllm.conftest import REGION, SERVED, VllmStack, stream, until
from tests.support.sse import StreamResult

MAX_TOKENS = 200
# A stream that is surely still being made when its first token reaches the client: vLLM on two busy cores
# sends its SSE in bursts (its API server starved by its engine core), and a client has seen the first token
# of a 1000-token stream 4.5 s into its 5 s (2048 is the servers' max_model_len).
LONG_TOKENS = 2000
# Each round restarts a vLLM (~40 s of CPU), so CI's rounds are few: two per signal, one per engine as the
# victim, killing at a different point (6 and 20 tokens into the first stream), x 5 streams per round.
# bench/vllm_kill_loop.py runs ten per signal (LIFELINE_VLLM_KILL_ROUNDS) and tabulates every stream that
# LIFELINE_VLLM_KILL_LOG records (docs/benchmarks.md).
ROUNDS_PER_SIGNAL = int(os.environ.get("LIFELINE_VLLM_KILL_ROUNDS", "2"))
KILL_LOG = os.environ.get("LIFELINE_VLLM_KILL_LOG")
KILL_POINTS = (6, 20, 2, 12, 30)  # tokens into the first stream, round by round
SPARE_ROUNDS = 2  # more rounds, only while too few have moved streams
# Rounds that must have moved a stream. A SIGKILL moves every stream in flight. A SIGTERM lets vLLM drain: a
# stream may finish whole on the dying server (seen in 1 to 3 rounds of 5 on two cores), which is the drain
# doing its work; what must never happen is an answer cut short, and every round checks that.
MOVED_ROUNDS = {signal.SIGKILL: ROUNDS_PER_SIGNAL, signal.SIGTERM: 1}

REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "completion-greedy": ("/v1/completions", {"prompt": "The region failed over while the stream", "temperature": 0.0}),
    "completion-seeded": ("/v1/completions", {"prompt": "Every token committed once", "temperature": 0.8,
                                              "top_p": 0.95, "seed": 7}),
    "chat-greedy": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "say what a lease is"}],
                                             "temperature": 0.0}),
    "chat-seeded": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a drill, step by step"}],
                                             "temperature": 1.0, "top_k": 40, "seed": 11}),
    # An agent's turn: tools offered, a call and its result in the history; rendered by the model's template
    # into the prompt vLLM gets, and resumed like any other stream (tests/unit/gateway/test_gateway_tool_calls.py
    # has the call parsing and its replay)
    "chat-tools": ("/v1/chat/completions", {"messages": [
        {"role": "user", "content": "is the standby region warm?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "pool_status", "arguments": '{"region": "us-east"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"serving": 2, "warm": 1}'}],
        "tools": [{"type": "function", "function": {"name": "pool_status", "description": "a region's warm pool",
                                                    "parameters": {"type": "object", "properties": {
                                                        "region": {"type": "string"}}}}}],
        "temperature": 0.0}),
}


def body(name: str) -> tuple[str, dict[str, Any]]:
    path, fields = REQUESTS[name]
    return path, {"model": SERVED, "max_tokens": MAX_TOKENS, "ignore_eos": True, **fields}


@pytest.fixture(scope="module")
def undisturbed(vllm_stack: VllmStack) -> dict[str, list[int]]:
    """Each request's tokens with no fault, on each vLLM: the two must agree, or nothing below means anything."""
    runs: dict[str, list[int]] = {}
    for name in REQUESTS:
        outputs = []
        for instance_id in vllm_stack.servers:
            result = stream(vllm_stack.gateway.url, *body(name), prefer=instance_id)
            assert result.done and result.error is None, (name, result.error)
            assert len(result.token_ids) == MAX_TOKENS and max(result.epochs) == 0, name
            outputs.append(result.token_ids)
        assert outputs[0] == outputs[1], f"{name}: the two vLLMs disagree without any fault"
        runs[name] = outputs[0]
    return runs


def test_both_vllms_answer_that_they_sample_position_keyed(vllm_stack: VllmStack) -> None:
    for server in vllm_stack.servers.values():
        answer = oneshot_http.post(f"{server.url}/v1/completions", json=identify_request(SERVED), timeout=30)
        assert sampling_from_answer(answer.status_code, answer.text) is Sampling.POSITION_KEYED, answer.text


def test_vllm_with_the_sampler_draws_what_the_reference_engine_draws(
        vllm_stack: VllmStack, engine_factory: Any, tiny_model: Path) -> None:
    """Seeded sampling is identical across engine kinds, not only across vLLMs (same weights, same draws)."""
    reference = engine_factory("reference-sampler")
    vllm = next(iter(vllm_stack.servers.values()))
    prompt = [5, 17, 300, 42, 9]
    for sampling in ({"temperature": 0.8, "seed": 7}, {"temperature": 1.0, "top_p": 0.9, "seed": 3},
                     {"temperature": 1.2, "top_k": 50, "seed": 11}):
        outputs = []
        for url, model in ((vllm.url, SERVED), (reference.url, tiny_model.name)):
            answer = oneshot_http.post(f"{url}/v1/completions", timeout=60, json={
                "model": model, "prompt": prompt, "max_tokens": 48, "return_token_ids": True, **sampling})
            assert answer.status_code == 200, answer.text
            outputs.append(answer.json()["choices"][0]["token_ids"])
        assert outputs[0] == outputs[1], sampling


def run_round(stack: VllmStack, victim: str, sig: signal.Signals, kill_after: int) -> dict[str, StreamResult]:
    """Every request's stream pinned to `victim`; `sig` to it once one has `kill_after` tokens; every result."""
    progress = {name: 0 for name in REQUESTS}
    all_started = threading.Event()
    fired = threading.Event()

    def on_token(name: str, count: int) -> None:
        progress[name] = count
        if max(progress.values()) >= kill_after:  # the others may not have their first token yet: a kill then too
            all_started.set()

    def signal_victim() -> None:
        all_started.wait(120)
        server = stack.servers[victim]
        if sig is signal.SIGKILL:
            server.kill()
        else:
            server.terminate()
        fired.set()

    killer = threading.Thread(target=signal_victim, daemon=True)
    killer.start()
    with ThreadPoolExecutor(len(REQUESTS)) as pool:
        futures = {name: pool.submit(stream, stack.gateway.url, *body(name), prefer=victim,
                                     on_token=lambda count, name=name: on_token(name, count)) for name in REQUESTS}
        results = {name: future.result(timeout=300) for name, future in futures.items()}
    killer.join(30)
    assert fired.is_set(), f"the streams ended before {victim} was signalled: {progress}"
    return results


def record(sig: signal.Signals, round_no: int, victim: str, kill_after: int, name: str, result: StreamResult,
           undisturbed: list[int]) -> None:
    """One stream of a round, for bench/vllm_kill_loop.py's table: written before the round's checks."""
    if KILL_LOG is None:
        return
    gaps = sorted(b - a for a, b in zip(result.arrived, result.arrived[1:], strict=False))
    with open(KILL_LOG, "a", encoding="utf-8") as log:
        log.write(json.dumps({
            "signal": sig.name, "round": round_no, "victim": victim, "kill_after": kill_after, "request": name,
            "moved": bool(result.epochs) and max(result.epochs) > 0, "identical": result.token_ids == undisturbed,
            "whole": result.error is None and result.done and result.finish_reason == "length",
            "seqs_once": result.seqs == sorted(set(result.seqs)) and result.seqs[:1] == [0],
            "error": result.error, "move_gap_s": result.move_gap(),
            "median_gap_s": gaps[len(gaps) // 2] if gaps else None}) + "\n")


@pytest.mark.timeout(max(900, 240 * (ROUNDS_PER_SIGNAL + SPARE_ROUNDS)))  # a restart: 20-60 s on two busy cores
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_streams_continue_identically_when_the_vllm_serving_them_dies(
        vllm_stack: VllmStack, undisturbed: dict[str, list[int]], sig: signal.Signals) -> None:
    instances = list(vllm_stack.servers)
    moved: list[tuple[int, str]] = []
    rounds_that_moved: set[int] = set()
    round_no = 0
    # ROUNDS_PER_SIGNAL rounds, and more while fewer than MOVED_ROUNDS[sig] moved a stream. A round may move
    # none and still be right: the drain let its streams finish on the dying vLLM, or they were routed to the
    # other one because the victim was briefly unroutable (a probe that timed out on a loaded machine). Its
    # streams are checked token for token all the same.
    while round_no < ROUNDS_PER_SIGNAL or len(rounds_that_moved) < MOVED_ROUNDS[sig]:
        assert round_no < ROUNDS_PER_SIGNAL + SPARE_ROUNDS, (
            f"{sig.name}: only rounds {sorted(rounds_that_moved)} of {round_no} moved a stream", moved)
        vllm_stack.wait_all_routable()
        victim = instances[round_no % 2]
        generation = vllm_stack.leased()[victim]
        kill_after = KILL_POINTS[round_no % len(KILL_POINTS)]
        results = run_round(vllm_stack, victim, sig, kill_after=kill_after)
        for name, result in results.items():
            record(sig, round_no, victim, kill_after, name, result, undisturbed[name])
        for name, result in results.items():
            where = f"{sig.name} round {round_no}, {name}"
            assert result.error is None, (where, result.error)
            assert result.done and result.finish_reason == "length", where
            assert result.token_ids == undisturbed[name], where
            assert result.seqs == sorted(set(result.seqs)) and result.seqs[0] == 0, where
            if max(result.epochs) > 0:
                moved.append((round_no, name))
                rounds_that_moved.add(round_no)
        until(lambda: victim not in vllm_stack.leased() or vllm_stack.leased()[victim] != generation,
              f"{victim}'s lease gone after {sig.name}", timeout=30)
        vllm_stack.restart_in_background(victim)
        round_no += 1
    assert len(moved) >= 2 * MOVED_ROUNDS[sig], moved
    vllm_stack.wait_all_routable()
    assert set(vllm_stack.leased()) == set(instances)


def moved_tokens(result: StreamResult) -> int:
    """Tokens the stream got after its first move (chunks of epoch > 0)."""
    return sum(len(chunk["choices"][0].get("token_ids", [])) for chunk in result.chunks
               if chunk.get("choices") and chunk.get("lifeline", {}).get("epoch", 0) > 0)


def test_a_stream_moved_off_a_killed_vllm_is_one_trace_down_to_the_survivors_own_span(vllm_stack: VllmStack) -> None:
    """The client's trace through the gateway to stock vLLM: each gateway attempt sends its W3C `traceparent`,
    and the vLLM that finishes the stream exports its `llm_request` span as a child of that attempt, counting
    the tokens it made. The victim is SIGKILLed, so its own span is never sent: the gateway's failed attempt
    is the trace's record of it. The killed vLLM is left down: the next test restarts it its own way."""
    vllm_stack.wait_all_routable()
    survivor, victim = list(vllm_stack.servers)
    path, request = body("completion-greedy")
    request = {**request, "max_tokens": LONG_TOKENS}
    reference = stream(vllm_stack.gateway.url, path, request, prefer=survivor)
    assert reference.error is None and len(reference.token_ids) == LONG_TOKENS
    vllm_stack.wait_all_routable()  # the victim sat idle through that stream: its probes may have timed out
    trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
    server = vllm_stack.servers[victim]

    def on_token(count: int) -> None:  # the first bytes the client has: a request with none is retried, not moved
        if server.alive():
            server.kill()

    result = stream(vllm_stack.gateway.url, path, request, prefer=victim, traceparent=f"00-{trace_id}-{client_span}-01",
                    on_token=on_token)
    assert moved_tokens(result) > 0, "the stream ended before the kill"
    assert result.error is None and result.done and result.token_ids == reference.token_ids
    assert max(result.epochs) > 0

    def exported() -> list[dict[str, Any]] | None:
        spans = vllm_stack.traces.in_trace(trace_id)
        return spans if any(span["name"] == "llm_request" for span in spans) else None

    spans = until(exported, "the survivor vLLM's span in the client's trace", timeout=60)
    [root] = [s for s in spans if s["name"] == "gateway stream"]
    attempts = sorted((s for s in spans if s["name"] == "engine attempt"), key=lambda s: s["attributes"]["lifeline.epoch"])
    assert root["parent"] == client_span and all(a["parent"] == root["span_id"] for a in attempts)
    assert attempts[0]["attributes"]["lifeline.instance"] == victim and attempts[0]["status"] == 2  # an error
    finished = attempts[-1]
    assert finished["attributes"]["lifeline.instance"] == survivor and finished["status"] != 2
    [vllm_span] = [s for s in spans if s["name"] == "llm_request"]
    assert vllm_span["parent"] == finished["span_id"]
    assert vllm_span["attributes"]["gen_ai.usage.completion_tokens"] == moved_tokens(result)


def sampling_of(stack: VllmStack, instance_id: str) -> str | None:
    return next((lease.sampling for lease in stack.reader.list_instances(REGION) if lease.instance_id == instance_id),
                None)


@pytest.mark.timeout(900)
def test_without_the_sampler_a_seeded_stream_is_refused_and_an_unseeded_one_says_it_differs(
        vllm_stack: VllmStack) -> None:
    """Stock vLLM without Lifeline's sampler: the agent leases it as engine_default; no silent different output.

    Two sampled streams on it at once, then SIGKILL: the one whose client sent a seed (it asked for
    reproducible output) ends `not_resumable`; the one the gateway seeded continues on the other vLLM and
    says `continuation: may_differ` from the first moved token on.
    """
    plain = list(vllm_stack.servers)[1]
    server = vllm_stack.servers[plain]
    server.stop()  # whatever the test before left of it (the trace test kills it)
    server.logits_processor = False
    server.start()
    server.wait_ready()
    until(lambda: sampling_of(vllm_stack, plain) == "engine_default", f"{plain} leased as engine_default", 120)
    vllm_stack.wait_all_routable()
    path, seeded = body("completion-seeded")
    # Long streams, so that the kill finds both in flight: they start together but not in step.
    seeded = {**seeded, "max_tokens": LONG_TOKENS}
    unseeded = {k: v for k, v in seeded.items() if k != "seed"}
    progress = {"seeded": 0, "unseeded": 0}

    def on_token(name: str, count: int) -> None:
        progress[name] = count
        if min(progress.values()) > 0 and server.alive():  # the client has bytes of both
            server.kill()

    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(stream, vllm_stack.gateway.url, path, request, prefer=plain,
                                     on_token=lambda count, name=name: on_token(name, count))
                   for name, request in (("seeded", seeded), ("unseeded", unseeded))}
        refused, moved = (futures[name].result(timeout=300) for name in ("seeded", "unseeded"))
    assert not server.alive(), f"the streams ended before the kill: {progress}"
    assert refused.error is not None and refused.error["type"] == "not_resumable", refused.error
    assert "X-Lifeline-Continuation" in refused.error["message"]
    assert moved.error is None and moved.done and len(moved.token_ids) == LONG_TOKENS, moved.error
    moved_at = moved.continuations.index("may_differ")
    assert moved.epochs[moved_at] > 0 and set(moved.continuations[moved_at:]) == {"may_differ"}
    assert set(moved.continuations[:moved_at]) == {None}
