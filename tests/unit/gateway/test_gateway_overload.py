"""An engine whose queue is full (429) is busy, not broken, and a stream's later migrations back off.

A 429 is admission, not failure: the request goes at once to an engine with
room, the refusal counts nothing toward the engine's ejection nor against
`max_migrations`; a request the client has no byte of waits for room at most
`admission.queue_timeout`, then is the client's 429 `overloaded` with the
engine's Retry-After; a started stream waits for room until its deadline and
ends whole. Re-sends after the first wait a jittered, capped, exponentially
growing time, bounded by what the deadline leaves.
"""

from __future__ import annotations

import pytest

from gateway.engine_client import OVERLOADED, EngineFailure
from gateway.errors import Overloaded
from gateway.token_log import Frame
from tests.unit.gateway.scripted import OPEN, Harness, frames_of


def _tokens(frames: list[Frame]) -> list[int]:
    return [t for f in frames for t in f.token_ids]


async def test_a_request_one_engine_refused_as_full_is_served_by_another_and_nobody_is_ejected(tiny_model):
    h = Harness(tiny_model, ["a", "b"], outlier={"consecutive_5xx": 1})
    await h.register()
    h.engines.script("a", EngineFailure(OVERLOADED, "queue full", retry_after_s=3.0))
    h.engines.script("b", OPEN, 6, ("finish", 7))
    frames = await frames_of((await h.session(max_tokens=2, prefer="a")).run())
    assert _tokens(frames) == [6, 7] and not any(f.kind == "error" for f in frames)
    assert [p[0] for p in h.engines.payloads] == ["a", "b"]
    assert {e.instance_id for e in await h.router.endpoints("v")} == {"a", "b"}  # a full queue ejects no one


async def test_a_request_every_engine_refused_as_full_waits_its_queue_timeout_then_gets_a_429(tiny_model, monkeypatch):
    h = Harness(tiny_model, ["a", "b"], admission={"queue_timeout": 0.35},
                recovery={"migration_backoff": 0.1, "migration_backoff_max": 2.0})
    await h.register()
    monkeypatch.setattr("gateway.recovery.random.uniform", lambda low, high: high)  # the jitter's top
    for _ in range(2):
        h.engines.script("a", EngineFailure(OVERLOADED, "queue full", retry_after_s=1.0))
        h.engines.script("b", EngineFailure(OVERLOADED, "queue full", retry_after_s=4.0))
    session = await h.session(max_tokens=2, prefer="a")
    with pytest.raises(Overloaded) as refused:
        await frames_of(session.run())
    # waits 0, 0.1, 0.2 (0.3 s of its 0.35 s queue timeout), and the next one (0.4) would pass it: the 429
    assert [p[0] for p in h.engines.payloads] == ["a", "b", "a", "b"]
    assert (refused.value.status_code, refused.value.error_type, refused.value.retry_after_s) == (429, "overloaded", 4.0)
    assert session.migrations == 0 and h.metrics.overload_resends._value.get() == 4


async def test_a_started_stream_waits_for_room_on_the_only_engine_and_ends_whole(tiny_model):
    h = Harness(tiny_model, ["a", "b"])
    await h.register()
    h.engines.script("a", OPEN, 5, EngineFailure("connection_lost"))
    h.engines.script("b", EngineFailure(OVERLOADED, "queue full", retry_after_s=1.0))  # b is full: wait, b again
    h.engines.script("b", OPEN, 6, ("finish", 7))
    session = await h.session(max_tokens=3, prefer="a")
    frames = await frames_of(session.run())
    assert _tokens(frames) == [5, 6, 7] and not any(f.kind == "error" for f in frames)
    assert [p[0] for p in h.engines.payloads] == ["a", "b", "b"]
    assert session.migrations == 1  # the crash; the 429 was a wait for room, not a migration
    assert h.budget().active_retries == 0


@pytest.mark.parametrize(("attempt", "ceiling"), [(0, 0.0), (1, 0.0), (2, 0.1), (3, 0.2), (4, 0.4), (7, 2.0)])
async def test_re_sends_after_the_first_back_off_exponentially_up_to_the_cap(tiny_model, monkeypatch, attempt, ceiling):
    h = Harness(tiny_model, ["a"], recovery={"migration_backoff": 0.1, "migration_backoff_max": 2.0})
    session = await h.session()
    monkeypatch.setattr("gateway.recovery.random.uniform", lambda low, high: high)  # the jitter's top
    assert session._backoff(attempt) == pytest.approx(ceiling)


async def test_a_wait_never_spends_the_time_the_deadline_keeps(tiny_model):
    h = Harness(tiny_model, ["a"], recovery={"min_deadline_remaining": 0.5})
    session = await h.session()
    session.request.deadline_wall = h.clock.wall() + 1.5
    assert session._room() == pytest.approx(1.0)
    session.request.deadline_wall = h.clock.wall() + 0.2
    assert session._room() == 0.0


async def test_a_resumed_stream_the_client_holds_bytes_of_waits_for_room_instead_of_a_429(tiny_model, monkeypatch):
    from gateway.recovery import StreamSession

    # A fresh request would get its 429 at the second refusal: its wait (0.1 s) is over the queue timeout.
    h = Harness(tiny_model, ["a"], admission={"queue_timeout": 0.05}, recovery={"migration_backoff": 0.1})
    await h.register()
    monkeypatch.setattr("gateway.recovery.random.uniform", lambda low, high: high)
    for _ in range(2):
        h.engines.script("a", EngineFailure(OVERLOADED, "queue full", retry_after_s=1.0))
    h.engines.script("a", OPEN, 6, ("finish", 7))
    fresh = await h.session(max_tokens=3)
    resumed = StreamSession.from_log(h.deps, fresh.request, h.tokenizer, epoch=0, migrations=0,
                                     frames=[Frame(seq=0, kind="token", epoch=0, token_ids=(5,), text="")])
    frames = await frames_of(resumed.run())
    assert _tokens(frames) == [6, 7] and not any(f.kind == "error" for f in frames)
    assert [p[0] for p in h.engines.payloads] == ["a", "a", "a"]
