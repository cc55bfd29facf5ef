"""An engine whose queue is full (429) is busy, not broken, and a stream's later migrations back off.

A request the first engine refused with 429 goes to another engine at once and
the refusal counts nothing toward the refusing engine's ejection; a request
every engine refused was never started, so the client gets the 429
`overloaded` it can retry on, with the longest Retry-After the engines asked
for — not a failed stream. Migrations after the first wait a jittered,
capped, exponentially growing time, bounded by what the deadline leaves.
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


async def test_a_request_every_engine_refused_as_full_gets_a_429_with_the_longest_retry_after(tiny_model):
    h = Harness(tiny_model, ["a", "b"])
    await h.register()
    for _ in range(2):  # each is tried again after a backoff, until the migration cap (3) is spent
        h.engines.script("a", EngineFailure(OVERLOADED, "queue full", retry_after_s=1.0))
        h.engines.script("b", EngineFailure(OVERLOADED, "queue full", retry_after_s=4.0))
    session = await h.session(max_tokens=2, prefer="a")
    with pytest.raises(Overloaded) as refused:
        await frames_of(session.run())
    assert [p[0] for p in h.engines.payloads] == ["a", "b", "a", "b"]
    assert (refused.value.status_code, refused.value.error_type, refused.value.retry_after_s) == (429, "overloaded", 4.0)
    assert "queue limit" in refused.value.message


async def test_a_stream_that_had_started_is_not_turned_into_a_429(tiny_model):
    h = Harness(tiny_model, ["a", "b"])
    await h.register()
    h.engines.script("a", OPEN, 5, EngineFailure("connection_lost"))
    h.engines.script("b", EngineFailure(OVERLOADED, "queue full", retry_after_s=1.0))
    frames = await frames_of((await h.session(max_tokens=3, prefer="a")).run())
    error = next(f.error for f in frames if f.kind == "error")
    assert _tokens(frames) == [5] and error["type"] != "overloaded"  # the client holds tokens: the stream failed


@pytest.mark.parametrize(("migrations", "ceiling"), [(0, 0.0), (1, 0.0), (2, 0.1), (3, 0.2), (4, 0.4), (7, 2.0)])
async def test_migrations_after_the_first_back_off_exponentially_up_to_the_cap(tiny_model, monkeypatch, migrations,
                                                                               ceiling):
    h = Harness(tiny_model, ["a"], recovery={"migration_backoff": 0.1, "migration_backoff_max": 2.0})
    session = await h.session()
    monkeypatch.setattr("gateway.recovery.random.uniform", lambda low, high: high)  # the jitter's top
    session.migrations = migrations
    assert session._backoff(h.settings.recovery) == pytest.approx(ceiling)


async def test_a_backoff_never_spends_the_time_the_deadline_needs(tiny_model, monkeypatch):
    h = Harness(tiny_model, ["a"], recovery={"migration_backoff": 10.0, "migration_backoff_max": 60.0,
                                             "min_deadline_remaining": 0.5})
    session = await h.session()
    session.request.deadline_wall = h.clock.wall() + 1.5
    monkeypatch.setattr("gateway.recovery.random.uniform", lambda low, high: high)
    session.migrations = 3
    assert session._backoff(h.settings.recovery) == pytest.approx(1.0)
