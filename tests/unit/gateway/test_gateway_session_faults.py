"""Session-level faults on a scripted engine client: the retry budget, lapsed leases, drains, cancels."""

from __future__ import annotations

import asyncio

import pytest

from contract.lease import Registration
from gateway.engine_client import DRAINING, EngineFailure
from gateway.token_log import Frame
from tests.unit.gateway.scripted import OPEN, Harness, frames_of


def _tokens(frames: list[Frame]) -> list[int]:
    return [t for f in frames for t in f.token_ids]


def _error(frames: list[Frame]) -> dict | None:
    return next((f.error for f in frames if f.kind == "error"), None)


async def test_a_migration_gives_its_retry_token_back_when_the_continuation_starts(tiny_model):
    """The budget bounds concurrent migrations: a stream that migrated and continues holds no token."""
    h = Harness(tiny_model, ["a", "b"], admission={"retry_budget_min": 1, "retry_budget_ratio": 0.0})
    await h.register()
    pause = asyncio.Event()
    h.engines.script("a", OPEN, 5, EngineFailure("connection_lost"))
    h.engines.script("b", OPEN, 6, pause, ("finish", 7))  # the first stream's continuation, still running
    h.engines.script("c", OPEN, 5, EngineFailure("connection_lost"))
    h.engines.script("b", OPEN, 6, ("finish", 7))

    first = (await h.session(max_tokens=3, prefer="a")).run()
    async for item in first:
        if isinstance(item, Frame) and item.token_ids == (6,):
            break
    assert h.budget().active_retries == 0  # the continuation's first token ended the migration
    await h.registry.register(Registration("c", "http://c", "v"))

    second = await frames_of((await h.session(max_tokens=3, prefer="c")).run())
    assert _error(second) is None and _tokens(second) == [5, 6, 7]
    pause.set()
    rest = await frames_of(first)
    assert _error(rest) is None and _tokens(rest) == [7]


async def test_a_retry_token_is_still_refused_while_another_migration_is_in_flight(tiny_model):
    h = Harness(tiny_model, ["a", "b"], admission={"retry_budget_min": 1, "retry_budget_ratio": 0.0, "queue_timeout": 0})
    await h.register()
    assert h.router.try_retry()  # another stream is between its failure and its continuation's first token
    h.engines.script("a", OPEN, 5, EngineFailure("connection_lost"))
    frames = await frames_of((await h.session(max_tokens=3, prefer="a")).run())
    assert _error(frames)["type"] == "retry_budget_exhausted"


async def test_a_migration_over_the_budget_waits_for_another_to_end(tiny_model):
    """One engine death fails several streams at once: the ones over the budget wait their turn, none is lost."""
    h = Harness(tiny_model, ["a", "b"], admission={"retry_budget_min": 1, "retry_budget_ratio": 0.0, "queue_timeout": 60})
    await h.register()
    assert h.router.try_retry()  # another stream's migration is in flight
    h.engines.script("a", OPEN, 5, EngineFailure("connection_lost"))
    h.engines.script("b", OPEN, 6, ("finish", 7))
    run = asyncio.ensure_future(frames_of((await h.session(max_tokens=3, prefer="a")).run()))
    while h.metrics.engine_attempts._value.get() < 1 or h.router.outliers._records == {}:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    assert not run.done()  # waiting for a retry token
    h.router.end_retry()  # the other migration's continuation produced its first token
    async with asyncio.timeout(30):
        frames = await run
    assert _error(frames) is None and _tokens(frames) == [5, 6, 7]


async def test_a_request_leaves_an_engine_whose_lease_lapsed_before_the_first_token(tiny_model):
    """A hung engine (SIGSTOP) stops renewing; the request moves when its lease lapses, not at the timeout."""
    h = Harness(tiny_model, ["hung", "ok"], recovery={"first_token_timeout": 3600.0})
    await h.register()
    h.engines.script("hung", OPEN, asyncio.Event())  # accepted, then silence
    h.engines.script("ok", OPEN, 5, 6, ("finish", 7))
    session = await h.session(max_tokens=3, prefer="hung")
    run = asyncio.ensure_future(frames_of(session.run()))
    await asyncio.sleep(0.01)
    h.clock.advance(1.5)
    ok = next(lease for lease in await h.registry.live() if lease.instance_id == "ok")
    await h.registry.renew("ok", ok.generation)
    h.clock.advance(1.0)  # "hung" registered 2.5 s ago and never renewed: its 2 s lease lapsed
    async with asyncio.timeout(30):  # a guard against hanging, not a measurement
        frames = await run
    assert _error(frames) is None and _tokens(frames) == [5, 6, 7]
    assert h.metrics.migrations.labels(reason="lease_lapsed", strategy="token_commit_resume")._value.get() == 1
    assert [p[0] for p in h.engines.payloads] == ["hung", "ok"]


async def test_the_first_token_wait_grows_with_the_prompt(tiny_model):
    h = Harness(tiny_model, ["a"], recovery={"first_token_timeout": 4.0, "prefill_tokens_per_s": 1000.0})
    await h.register()
    h.engines.script("a", OPEN, ("finish", 5))
    session = await h.session(max_tokens=1)
    session.request.prompt_ids = list(range(1, 6001))
    await frames_of(session.run())
    assert h.engines.payloads[0][2] == pytest.approx(4.0 + 6.0)


async def test_a_draining_engine_migrates_without_spending_the_retry_budget(tiny_model):
    h = Harness(tiny_model, ["a", "b"], admission={"retry_budget_min": 0, "retry_budget_ratio": 0.0})
    await h.register()
    h.engines.script("a", OPEN, 5, EngineFailure(DRAINING, "planned shutdown"))
    for instance in ("a", "b"):  # a draining engine leaves routing by its lease; either may take the rest here
        h.engines.script(instance, OPEN, 6, ("finish", 7))
    frames = await frames_of((await h.session(max_tokens=3, prefer="a")).run())
    assert _error(frames) is None and _tokens(frames) == [5, 6, 7]
    assert h.budget().active_retries == 0
    assert h.router.outliers._records == {}  # a planned drain is no failure of the endpoint


async def test_cancel_sends_an_attached_client_a_final_typed_event(tiny_model):
    h = Harness(tiny_model, ["a"])
    await h.register()
    pause = asyncio.Event()
    h.engines.script("a", OPEN, 5, pause, 6, 7, ("finish", 8))
    session = await h.session(max_tokens=4)
    run = session.run()
    async for item in run:
        if isinstance(item, Frame) and item.token_ids == (5,):
            break
    assert await h.log.cancel(session.request.request_id)
    pause.set()
    rest = await frames_of(run)
    assert [f.kind for f in rest] == ["token", "error"]
    assert rest[0].finish_reason == "error" and rest[1].error["type"] == "cancelled"
    assert [f.seq for f in rest] == [1, 2]  # contiguous after the last committed frame


async def test_one_transient_500_per_engine_leaves_the_fleet_routable(tiny_model):
    h = Harness(tiny_model, ["a", "b"])
    await h.register()
    # Each answers one request with a 500; that request continues on the other engine (never the one that failed it).
    h.engines.script("a", EngineFailure("http_500", "transient"))
    h.engines.script("b", OPEN, 5, ("finish", 6))
    h.engines.script("b", EngineFailure("http_500", "transient"))
    h.engines.script("a", OPEN, 5, ("finish", 6))
    for prefer in ("a", "b"):
        frames = await frames_of((await h.session(max_tokens=2, prefer=prefer)).run())
        assert _error(frames) is None and _tokens(frames) == [5, 6]
    assert [p[0] for p in h.engines.payloads] == ["a", "b", "b", "a"]
    assert {e.instance_id for e in await h.router.endpoints("v")} == {"a", "b"}


async def test_cancel_ends_a_resumed_client_tailing_another_replicas_stream(tiny_model):
    from gateway.serving import follow
    from gateway.sessions import SessionKeeper
    from gateway.state import GatewayState

    h = Harness(tiny_model, ["a"])
    sessions = SessionKeeper(h.settings.sessions, h.router.table, h.metrics, h.clock)
    st = GatewayState(h.settings, h.router.table, h.registry, h.view, h.log, h.deps, h.metrics, sessions)
    session = await h.session(max_tokens=8)  # created in the log, owned by gw-1, driven elsewhere
    rid = session.request.request_id
    for seq in range(2):
        assert await h.log.append(rid, 0, Frame(seq=seq, kind="token", epoch=0, token_ids=(5 + seq,), text="x"))
    await h.log.refresh_owner(rid, "gw-other", 0)
    tail = follow(st, session.request, h.router.table.resolve("m"), after=0)
    assert (await anext(tail)).seq == 1
    pending = asyncio.ensure_future(anext(tail))
    await asyncio.sleep(0.01)
    assert await h.log.cancel(rid)
    async with asyncio.timeout(30):
        last_chunk = await pending
    error = await anext(tail)
    assert (last_chunk.seq, last_chunk.finish_reason) == (2, "error")
    assert (error.seq, error.kind, error.error["type"]) == (3, "error", "cancelled")
    with pytest.raises(StopAsyncIteration):
        await anext(tail)
