"""A standby engine process (engine/standby.py) becomes the restarted engine: same semantics as a cold start.

Promises tested: service recovery (the activated standby is a new boot
generation of the same instance id and takes the dead tenant's place in the
holder), semantic recovery (a stream SIGKILLed mid-way continues
token-identically on it), and that a standby holds nothing before it is
activated — no boot generation, no holder lease, no port. The failures: a
standby that is itself SIGKILLed (the supervisor starts cold), a standby
activated after the holder died (loads from disk and says so), one activated
before its imports finished, and one retired unused. No wall-clock asserts:
bench/holder.py carries the speed claims.
"""

from __future__ import annotations

import signal

from common import oneshot_http
from tests.e2e.holder.conftest import PROMPT, completion_tokens, kill_mid_stream, prompt_ids, weights_origin

MAX_TOKENS = 24


def generation_of(url: str) -> int:
    return oneshot_http.get(f"{url}/healthz/generation", timeout=5).json()["generation"]


def test_standby_takes_over_a_killed_stream_token_identically_and_again_when_killed_itself(fleet_factory):
    fleet = fleet_factory()
    holder = fleet.start_holder()
    engine = fleet.start_engine("engine-a", ["--holder", holder.url])
    expected = completion_tokens(engine.url, PROMPT, MAX_TOKENS)
    ids = prompt_ids(engine.url, PROMPT)
    generation = generation_of(engine.url)
    standby = fleet.start_standby()

    # Warm, and holding nothing: no tenant at the holder, no boot generation taken.
    assert [t["tenant_id"] for t in holder.state()["tenants"]] == ["engine-a"]
    assert (engine.state_dir / "generation").read_text().strip() == str(generation)

    committed = kill_mid_stream(engine, PROMPT, MAX_TOKENS, after=9)
    assert engine.process.returncode == -signal.SIGKILL

    standby_pid = standby.process.pid
    restarted = fleet.activate(standby, "engine-a", ["--holder", holder.url])
    assert restarted.process.pid == standby_pid  # the standby itself became the engine, no new interpreter
    origin = weights_origin(restarted)
    assert (origin["source"], origin["region_id"], origin["takeover"]) == ("holder", 1, True)
    assert generation_of(restarted.url) == generation + 1
    tenant = holder.tenant("engine-a")
    assert (tenant["generation"], tenant["state"], tenant["takeovers"]) == (generation + 1, "attached", 1)
    assert committed + completion_tokens(restarted.url, ids + committed, MAX_TOKENS - len(committed)) == expected

    # The engine the standby became is SIGKILLed in turn: the next standby takes over under the next generation.
    spare = fleet.start_standby()
    restarted.kill(signal.SIGKILL)
    again = fleet.activate(spare, "engine-a", ["--holder", holder.url])
    assert again.process.pid != standby_pid
    assert generation_of(again.url) == generation + 2
    assert (weights_origin(again)["source"], holder.tenant("engine-a")["takeovers"]) == ("holder", 2)
    assert completion_tokens(again.url, PROMPT, MAX_TOKENS) == expected


def test_a_standby_killed_before_activation_leaves_the_supervisor_a_cold_start(fleet_factory):
    fleet = fleet_factory()
    holder = fleet.start_holder()
    engine = fleet.start_engine("engine-a", ["--holder", holder.url])
    expected = completion_tokens(engine.url, PROMPT, MAX_TOKENS)
    generation = generation_of(engine.url)
    standby = fleet.start_standby()
    standby_pid = standby.process.pid
    standby.process.send_signal(signal.SIGKILL)
    standby.process.wait()
    assert not standby.alive and not standby.warm
    engine.kill(signal.SIGKILL)

    restarted = fleet.activate(standby, "engine-a", ["--holder", holder.url])  # activate() says None: cold
    assert restarted.process.pid != standby_pid
    assert generation_of(restarted.url) == generation + 1
    assert weights_origin(restarted)["takeover"] is True
    assert completion_tokens(restarted.url, PROMPT, MAX_TOKENS) == expected


def test_a_standby_activated_after_the_holder_died_loads_from_disk_and_says_so(fleet_factory):
    fleet = fleet_factory()
    holder = fleet.start_holder()
    engine = fleet.start_engine("engine-a", ["--holder", holder.url])
    expected = completion_tokens(engine.url, PROMPT, MAX_TOKENS)
    standby = fleet.start_standby(warm=False)  # activated below whether or not its imports are done
    holder.kill(signal.SIGKILL)
    engine.kill(signal.SIGKILL)

    restarted = fleet.activate(standby, "engine-a", ["--holder", holder.url])
    origin = weights_origin(restarted)
    assert origin["source"] == "disk"
    assert "unreachable" in origin["fallback_reason"]
    assert "holder unavailable; loading weights from disk" in restarted.logs()
    assert completion_tokens(restarted.url, PROMPT, MAX_TOKENS) == expected


def test_a_retired_standby_exits_without_serving(fleet_factory):
    fleet = fleet_factory()
    standby = fleet.start_standby()
    process = standby.process
    standby.close()
    assert process.returncode == 0
    assert not standby.alive and standby.activate(["--model", str(fleet.model)]) is None
    assert "engine starting" not in standby.log_path.read_text()
