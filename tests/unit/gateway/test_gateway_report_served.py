"""`LiveEndpoint.served_ok_at`: when a stream last finished on the endpoint, as the regional agent reads it."""

from __future__ import annotations

from datetime import datetime

from gateway.engine_client import EngineFailure
from gateway.report import ServedLedger, build_report
from tests.unit.gateway.scripted import OPEN, Harness, frames_of


async def _report(h: Harness):
    return await build_report(replica_id="gw-1", region="local", zone="local-a", table=h.router.table, router=h.router,
                              live=h.view.current, admitted=h.view.current, clock=h.clock, served=h.deps.served)


def _served(report) -> dict[str, datetime | None]:
    return {e.instance_id: e.served_ok_at for e in report.live_endpoints}


async def test_served_ok_at_is_when_the_last_stream_finished_on_the_endpoint(tiny_model):
    h = Harness(tiny_model, ["a", "b"])
    await h.register()
    assert _served(await _report(h)) == {"a": None, "b": None}

    h.engines.script("a", OPEN, 5, 6, ("finish", 7))
    h.clock.advance(1)
    finished_at = h.clock.utcnow()
    await frames_of((await h.session(max_tokens=3, prefer="a")).run())
    h.clock.advance(0.5)  # the report goes out later (within the lease TTL); it still says when the stream finished
    assert _served(await _report(h)) == {"a": finished_at, "b": None}


async def test_an_engine_that_failed_mid_stream_is_not_credited_the_one_that_finished_it_is(tiny_model):
    h = Harness(tiny_model, ["a", "b"])
    await h.register()
    h.engines.script("a", OPEN, 5, EngineFailure("connection_lost"))  # a first token, then the engine dies
    h.engines.script("b", OPEN, 6, ("finish", 7))
    await frames_of((await h.session(max_tokens=3, prefer="a")).run())

    [a] = [lease for lease in await h.view.current() if lease.instance_id == "a"]
    assert _served(await _report(h)) == {"b": h.clock.utcnow()}  # "a" is outlier-ejected: not a live endpoint now
    assert h.deps.served.served_ok_at(("a", a.generation)) is None


async def test_a_stream_the_client_left_credits_nobody(tiny_model):
    h = Harness(tiny_model, ["a"])
    await h.register()
    h.engines.script("a", OPEN, 5, 6, ("finish", 7))
    items = (await h.session(max_tokens=3, prefer="a")).run()
    async for _ in items:  # OPENED, then the first token: the client goes away
        break
    await items.aclose()
    assert _served(await _report(h)) == {"a": None}


async def test_a_restarted_engine_starts_with_no_credit_and_the_old_generation_is_forgotten(tiny_model):
    h = Harness(tiny_model, ["a"])
    await h.register()
    h.engines.script("a", OPEN, 5, 6, ("finish", 7))
    await frames_of((await h.session(max_tokens=3, prefer="a")).run())
    [before] = (await _report(h)).live_endpoints
    assert before.served_ok_at is not None

    await h.registry.release("a", before.generation)
    await h.register()  # the same instance id, a new generation
    [after] = (await _report(h)).live_endpoints
    assert after.generation != before.generation and after.served_ok_at is None
    assert h.deps.served.served_ok_at(("a", before.generation)) is None  # retained only for live leases


def test_the_ledger_keeps_the_newest_time_per_endpoint():
    ledger = ServedLedger()
    late, early = datetime(2026, 1, 1, 12, 0, 5), datetime(2026, 1, 1, 12, 0, 1)
    ledger.note(("a", 1), late)
    ledger.note(("a", 1), early)  # a slower stream finishing out of order does not move it back
    assert ledger.served_ok_at(("a", 1)) == late and ledger.served_ok_at(("a", 2)) is None
