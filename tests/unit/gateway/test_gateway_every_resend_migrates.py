"""Every re-send to an engine is a counted migration, back to an engine that failed it only as a last resort.

An engine's "abort" is a failure, not an end; an engine that streams no token
ids is ejected and, when nothing else can continue, refused typed
(`engine_incompatible`); a stream that goes silent on an engine that left
routing moves at once, without a retry-budget token.
"""

from __future__ import annotations

import asyncio

import pytest

from contract.engine_support import MIN_VLLM_VERSION
from contract.lease import Registration
from gateway.engine_client import ABORTED, NO_TOKEN_IDS, EngineFailure, EngineToken
from gateway.errors import GatewayError
from gateway.token_log import Frame
from tests.unit.gateway.scripted import OPEN, SILENT, Harness, frames_of

# Failures never eject locally here, so only the session's own exclusion keeps a continuation off the failed engine.
LENIENT = {"consecutive_5xx": 100, "consecutive_local_failures": 100}


def _tokens(frames: list[Frame]) -> list[int]:
    return [t for f in frames for t in f.token_ids]


def _error(frames: list[Frame]) -> dict | None:
    return next((f.error for f in frames if f.kind == "error"), None)


def _migrations(h: Harness, reason: str) -> float:
    return h.metrics.migrations.labels(reason=reason, strategy="token_commit_resume")._value.get()


async def test_an_engines_abort_migrates_the_stream_instead_of_ending_it(tiny_model):
    h = Harness(tiny_model, ["a", "b"])
    await h.register()
    h.engines.script("a", OPEN, 5, EngineFailure(ABORTED, "finish_reason 'abort'"))
    h.engines.script("b", OPEN, 6, ("finish", 7))
    frames = await frames_of((await h.session(max_tokens=3, prefer="a")).run())
    assert _error(frames) is None and _tokens(frames) == [5, 6, 7]
    assert [f.finish_reason for f in frames if f.kind == "token"] == [None, None, "length"]
    assert _migrations(h, ABORTED) == 1
    assert h.engines.payloads[1][1]["prompt"] == [1, 2, 3, 5]


async def test_a_continuation_never_goes_back_to_the_endpoint_that_failed_it(tiny_model):
    h = Harness(tiny_model, ["a", "b"], outlier=LENIENT)
    await h.register()
    h.engines.script("a", OPEN, 5, EngineFailure("connection_lost"))
    h.engines.script("a", OPEN, 6, ("finish", 7))  # would be taken if the failed endpoint were still a candidate
    h.engines.script("b", OPEN, 6, ("finish", 7))
    for _ in range(5):  # least-loaded picks at random among equals: every draw must avoid "a"
        h.engines.payloads.clear()
        h.engines.scripts["a"] = [[OPEN, 5, EngineFailure("connection_lost")], [OPEN, 6, ("finish", 7)]]
        h.engines.scripts["b"] = [[OPEN, 6, ("finish", 7)]]
        frames = await frames_of((await h.session(max_tokens=3, prefer="a")).run())
        assert _error(frames) is None and _tokens(frames) == [5, 6, 7]
        assert [p[0] for p in h.engines.payloads] == ["a", "b"]


async def test_when_only_the_failed_endpoint_is_left_and_not_ejected_the_stream_goes_back_to_it(tiny_model):
    """A lone engine's transient 500 costs the request nothing: it is the last resort, not refused (Envoy's
    previous_hosts falls back to the same host too); the continuation carries the committed token."""
    h = Harness(tiny_model, ["a"], outlier=LENIENT)
    await h.register()
    h.engines.script("a", OPEN, 5, EngineFailure("http_500", "boom"))
    h.engines.script("a", OPEN, 6, ("finish", 7))
    frames = await frames_of((await h.session(max_tokens=3)).run())
    assert _error(frames) is None and _tokens(frames) == [5, 6, 7]
    assert [p[0] for p in h.engines.payloads] == ["a", "a"]
    assert h.engines.payloads[1][1]["prompt"] == [1, 2, 3, 5]


@pytest.mark.parametrize("reason", ["connect", "connection_lost"])
async def test_when_the_only_engine_left_is_ejected_the_stream_ends_no_healthy_endpoint_at_once(tiny_model, reason):
    """A refused or reset connection ejects even the last engine: nothing there answers, nothing to wait for."""
    h = Harness(tiny_model, ["a"], admission={"queue_timeout": 3600})
    await h.register()
    h.engines.script("a", OPEN, 5, EngineFailure(reason))
    h.engines.script("a", OPEN, 6, ("finish", 7))
    async with asyncio.timeout(30):  # no slot frees on an engine that is ejected
        frames = await frames_of((await h.session(max_tokens=3)).run())
    error = _error(frames)
    assert error["type"] == "no_healthy_endpoint" and "failed this request and are ejected (a@" in error["message"]
    assert [p[0] for p in h.engines.payloads] == ["a"]


async def test_an_endpoint_that_failed_earlier_is_taken_again_only_when_no_other_is_left(tiny_model):
    """One transient 500 on each of two engines costs the request nothing (Envoy's previous_hosts falls back too)."""
    h = Harness(tiny_model, ["a", "b", "c"], outlier=LENIENT)
    await h.register()
    h.engines.script("a", OPEN, 5, EngineFailure("http_500", "transient"))
    h.engines.script("b", OPEN, 6, EngineFailure("http_500", "transient"))
    h.engines.script("c", OPEN, 7, EngineFailure("http_500", "transient"))
    h.engines.script("a", OPEN, 8, ("finish", 9))
    frames = await frames_of((await h.session(max_tokens=5, prefer="a")).run())
    tokens = _tokens(frames)
    assert _error(frames) is None and tokens[0] == 5 and sorted(tokens[1:3]) == [6, 7] and tokens[3:] == [8, 9]
    order = [p[0] for p in h.engines.payloads]
    assert order[0] == "a" and set(order[1:3]) == {"b", "c"} and order[3] == "a"  # untried ones first, then a
    assert _migrations(h, "http_500") == 3


async def test_a_restarted_instance_is_a_new_endpoint_and_may_continue_the_stream(tiny_model):
    h = Harness(tiny_model, ["a"], outlier=LENIENT)
    await h.register()

    async def restart() -> None:
        await h.registry.register(Registration("a", "http://a", "v"))  # the same instance, a new generation

    h.engines.script("a", OPEN, 5, EngineFailure("connection_lost"))
    h.engines.script("a", OPEN, 6, ("finish", 7))
    run = (await h.session(max_tokens=3)).run()
    frames = []
    async for item in run:
        if isinstance(item, Frame):
            frames.append(item)
            if item.token_ids == (5,):
                await restart()
    assert _error(frames) is None and _tokens(frames) == [5, 6, 7]
    first, second = h.engines.endpoints
    assert first.instance_id == second.instance_id == "a" and second.generation > first.generation


async def test_an_engine_without_token_ids_is_ejected_and_the_stream_migrates_counted(tiny_model):
    h = Harness(tiny_model, ["old", "new"])
    await h.register()
    h.engines.script("old", OPEN, EngineFailure(NO_TOKEN_IDS, "no token ids"))
    h.engines.script("new", OPEN, 5, ("finish", 6))
    frames = await frames_of((await h.session(max_tokens=2, prefer="old")).run())
    assert _error(frames) is None and _tokens(frames) == [5, 6]
    assert _migrations(h, NO_TOKEN_IDS) == 1
    assert {e.instance_id for e in await h.router.endpoints("v")} == {"new"}  # ejected though it was one of two


async def test_when_no_engine_has_token_ids_the_client_gets_engine_incompatible(tiny_model):
    h = Harness(tiny_model, ["old-1", "old-2"])
    await h.register()
    for instance in ("old-1", "old-2"):
        h.engines.script(instance, OPEN, EngineFailure(NO_TOKEN_IDS, f"{instance} has no token ids"))
    frames = await frames_of((await h.session(max_tokens=2, prefer="old-1")).run())
    error = _error(frames)
    assert error["type"] == "engine_incompatible"
    assert "return_token_ids" in error["message"] and MIN_VLLM_VERSION in error["message"]
    assert _migrations(h, NO_TOKEN_IDS) == 2  # each re-send counted; none silent

    # The next request, before its first byte: an HTTP 502 of the same type, no engine contacted.
    sent = len(h.engines.payloads)
    with pytest.raises(GatewayError) as refused:
        await frames_of((await h.session(max_tokens=2)).run())
    assert (refused.value.status_code, refused.value.error_type) == (502, "engine_incompatible")
    assert "return_token_ids" in refused.value.message and MIN_VLLM_VERSION in refused.value.message
    assert len(h.engines.payloads) == sent


async def test_an_engine_stream_that_ends_without_a_final_token_is_a_counted_migration(tiny_model):
    """Nothing may send a stream round again without a migration: engines that end quietly exhaust the cap."""
    names = ["a", "b", "c", "d", "e"]
    h = Harness(tiny_model, names, outlier=LENIENT)
    await h.register()
    h.engines.script("a", OPEN, EngineToken(5, None))  # then the stream just ends, without a final token
    for name in names[1:]:
        h.engines.script(name, OPEN)  # accepted, then ended before any token
    async with asyncio.timeout(30):
        frames = await frames_of((await h.session(max_tokens=3, prefer="a")).run())
    assert _error(frames)["type"] == "migration_limit"
    assert _tokens(frames) == [5] and len(h.engines.payloads) == 4  # the first attempt and three migrations
    assert _migrations(h, "stream_ended") == 3


class _Verdicts:
    def __init__(self, actions: dict) -> None:
        self.actions = actions

    def action(self, key):
        return self.actions.get(key)


@pytest.mark.parametrize("leaves", ["lease_released", "agent_draining"])
async def test_a_stream_silent_on_an_engine_that_left_routing_migrates_at_once(tiny_model, leaves):
    """A drain before SIGTERM, then vLLM stops sending: the stream moves without waiting out the stall timeout."""
    h = Harness(tiny_model, ["a", "b"], recovery={"stall_timeout": 3600.0},
                admission={"retry_budget_min": 0, "retry_budget_ratio": 0.0, "queue_timeout": 0})
    await h.register()
    h.router.verdicts = _Verdicts({})
    h.engines.script("a", OPEN, 5, SILENT)
    h.engines.script("b", OPEN, 6, ("finish", 7))
    frames = []
    async with asyncio.timeout(30):  # a guard against hanging, not a measurement
        async for item in (await h.session(max_tokens=3, prefer="a")).run():
            if isinstance(item, Frame):
                frames.append(item)
                if item.token_ids == (5,):
                    a = h.engines.endpoints[0]
                    if leaves == "lease_released":
                        await h.registry.release(a.instance_id, a.generation)
                    else:
                        h.router.verdicts = _Verdicts({a.key: "no_new_sessions"})
    assert _error(frames) is None and _tokens(frames) == [5, 6, 7]
    assert _migrations(h, "engine_left_routing") == 1
    assert h.budget().active_retries == 0  # no retry token was needed (the budget here has none)
    assert h.router.outliers._records == {}  # routing had already taken it out: no failure counted against it


async def test_a_late_token_on_an_engine_still_routable_is_waited_for(tiny_model):
    h = Harness(tiny_model, ["a", "b"])
    await h.register()
    pause = asyncio.Event()
    h.engines.script("a", OPEN, 5, pause, ("finish", 6))
    run = asyncio.ensure_future(frames_of((await h.session(max_tokens=2, prefer="a")).run()))
    await asyncio.sleep(0.05)
    a = h.engines.endpoints[0]
    assert await h.router.left_routing(a) is None
    pause.set()
    async with asyncio.timeout(30):
        frames = await run
    assert _error(frames) is None and _tokens(frames) == [5, 6]
