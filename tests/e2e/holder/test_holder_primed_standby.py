"""A primed standby (engine/standby.py `--prime-holder`) becomes the restarted engine on the views it primed.

Promises tested, on real processes: semantic recovery (a stream SIGKILLed
mid-way continues token-identically, exact token ids, on the engine the
primed standby became), service recovery with the same semantics as a cold
start (a new boot generation, the holder's takeover of the same tenant id)
and that it served from the primed mapping — `/healthz/weights` `primed`,
`lifeline_engine_weights_primed` 1, the self-test taken from the priming
rather than run again. Miss, never misuse: a standby primed before its
holder restarted re-maps the region the restarted holder describes,
self-tests on it, and says why (`prime_miss_reason`, a log line, the miss
counter); a priming that cannot reach its holder leaves an unprimed standby
that still serves. Before activation a primed standby holds no tenancy.
No wall-clock asserts: bench/holder.py carries the speed claims.
"""

from __future__ import annotations

import json
import signal

from common import oneshot_http
from contract.standby import StandbyPrime
from lifeline.processes import free_port, scrape_metric
from tests.e2e.holder.conftest import PROMPT, completion_tokens, kill_mid_stream, prompt_ids, weights_origin

MAX_TOKENS = 24


def generation_of(url: str) -> int:
    return oneshot_http.get(f"{url}/healthz/generation", timeout=5).json()["generation"]


def self_test_lines(log: str) -> list[dict]:
    return [json.loads(line) for line in log.splitlines() if '"msg": "self-test passed"' in line]


def test_a_killed_stream_continues_token_identically_on_the_primed_standby_s_mapping(fleet_factory):
    fleet = fleet_factory()
    holder = fleet.start_holder()
    engine = fleet.start_engine("engine-a", ["--holder", holder.url])
    expected = completion_tokens(engine.url, PROMPT, MAX_TOKENS)
    ids = prompt_ids(engine.url, PROMPT)
    generation = generation_of(engine.url)
    standby = fleet.start_standby(prime=StandbyPrime(holder.url, fleet.model))
    assert standby.primed, standby.log_path.read_text()[-3000:]
    assert [t["tenant_id"] for t in holder.state()["tenants"]] == ["engine-a"]  # primed, and holding nothing

    committed = kill_mid_stream(engine, PROMPT, MAX_TOKENS, after=9)
    assert engine.process.returncode == -signal.SIGKILL
    restarted = fleet.activate(standby, "engine-a", ["--holder", holder.url])

    origin = weights_origin(restarted)
    assert (origin["source"], origin["primed"], origin["prime_miss_reason"]) == ("holder", True, None)
    assert (origin["region_id"], origin["takeover"]) == (1, True)
    assert scrape_metric(f"{restarted.url}/metrics", "lifeline_engine_weights_primed") == 1
    assert generation_of(restarted.url) == generation + 1
    tenant = holder.tenant("engine-a")
    assert (tenant["generation"], tenant["state"], tenant["takeovers"]) == (generation + 1, "attached", 1)
    [passed] = self_test_lines(restarted.logs())  # one self-test, the priming's, reported at activation
    assert passed["at_priming"] is True and len(passed["tokens"]) == 2
    assert committed + completion_tokens(restarted.url, ids + committed, MAX_TOKENS - len(committed)) == expected


def test_a_standby_primed_before_its_holder_restarted_re_maps_and_says_so(fleet_factory):
    fleet = fleet_factory()
    holder = fleet.start_holder()
    engine = fleet.start_engine("engine-a", ["--holder", holder.url])
    expected = completion_tokens(engine.url, PROMPT, MAX_TOKENS)
    standby = fleet.start_standby(prime=StandbyPrime(holder.url, fleet.model))
    assert standby.primed
    holder.kill(signal.SIGKILL)
    holder.start()  # replays its ledger and adopts the region under a new boot epoch
    holder.wait_ready()
    engine.kill(signal.SIGKILL)

    restarted = fleet.activate(standby, "engine-a", ["--holder", holder.url])
    origin = weights_origin(restarted)
    assert (origin["source"], origin["primed"], origin["takeover"]) == ("holder", False, True)
    assert origin["prime_miss_reason"] == "the holder restarted since priming (epoch 1 → 2)"
    assert origin["holder_epoch"] == 2
    assert "primed weights not used; re-mapping the region" in restarted.logs()
    assert scrape_metric(f"{restarted.url}/metrics", "lifeline_engine_prime_misses_total") == 1
    assert scrape_metric(f"{restarted.url}/metrics", "lifeline_engine_weights_primed") == 0
    [passed] = self_test_lines(restarted.logs())
    assert "at_priming" not in passed  # the self-test ran again, on the re-mapped region
    assert completion_tokens(restarted.url, PROMPT, MAX_TOKENS) == expected


def test_a_priming_that_cannot_reach_its_holder_leaves_a_standby_that_still_serves(fleet_factory):
    fleet = fleet_factory()
    holder = fleet.start_holder()
    engine = fleet.start_engine("engine-a", ["--holder", holder.url])
    expected = completion_tokens(engine.url, PROMPT, MAX_TOKENS)
    standby = fleet.start_standby(prime=StandbyPrime(f"http://127.0.0.1:{free_port()}", fleet.model))
    assert standby.warm and not standby.primed
    assert "standby not primed" in standby.log_path.read_text()
    engine.kill(signal.SIGKILL)

    restarted = fleet.activate(standby, "engine-a", ["--holder", holder.url])
    origin = weights_origin(restarted)
    assert (origin["source"], origin["primed"], origin["prime_miss_reason"], origin["takeover"]) == \
        ("holder", False, None, True)
    assert completion_tokens(restarted.url, PROMPT, MAX_TOKENS) == expected
