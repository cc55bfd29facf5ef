"""An engine SIGKILLed mid-stream comes back attached to the holder's weights and continues exactly.

Promises tested: service recovery (the restarted engine, under a higher
generation, maps the weights the holder kept instead of loading them) and
semantic recovery (the continuation from the committed prefix is
token-identical to an undisturbed greedy run, directly and behind a gateway).
The holder's lease layer must notice the dead tenant (frozen) and hand its
place only to the same instance id under a newer generation.
"""

from __future__ import annotations

import signal
import threading

from common import oneshot_http
from lifeline.processes import GatewayProcess, free_port, gateway_config
from tests.e2e.gateway.conftest import StreamResult, direct_tokens, stream
from tests.e2e.holder.conftest import (
    PROMPT,
    completion_tokens,
    kill_mid_stream,
    prompt_ids,
    wait_for,
    weights_origin,
)

MAX_TOKENS = 24


def test_engine_killed_mid_stream_reattaches_and_continues_token_identically(fleet_factory):
    fleet = fleet_factory()
    holder = fleet.start_holder()
    engine = fleet.start_engine("engine-a", ["--holder", holder.url])
    first = weights_origin(engine)
    assert (first["source"], first["region_id"], first["takeover"]) == ("holder", 1, False)
    expected = completion_tokens(engine.url, PROMPT, MAX_TOKENS)
    ids = prompt_ids(engine.url, PROMPT)
    generation = oneshot_http.get(f"{engine.url}/healthz/generation", timeout=5).json()["generation"]

    # Mid-stream: read 9 tokens of a streamed request, then SIGKILL the engine.
    committed = kill_mid_stream(engine, PROMPT, MAX_TOKENS, after=9)
    assert engine.process.returncode == -signal.SIGKILL
    assert committed == expected[:len(committed)]

    # The holder notices the silent tenant and freezes it; nothing else may take its place.
    frozen = wait_for(lambda: (t := holder.tenant("engine-a")) and t["frozen"] and t, "tenant frozen", timeout=30)
    assert (frozen["generation"], frozen["state"]) == (generation, "attached")

    restarted = fleet.start_engine("engine-a", ["--holder", holder.url])
    origin = weights_origin(restarted)
    assert (origin["source"], origin["region_id"], origin["takeover"]) == ("holder", 1, True)
    assert oneshot_http.get(f"{restarted.url}/healthz/generation", timeout=5).json()["generation"] == generation + 1
    tenant = holder.tenant("engine-a")
    assert (tenant["generation"], tenant["state"], tenant["frozen"], tenant["takeovers"]) == \
        (generation + 1, "attached", False, 1)

    continuation = completion_tokens(restarted.url, ids + committed, MAX_TOKENS - len(committed))
    assert committed + continuation == expected
    assert [r["region_id"] for r in holder.state()["regions"]] == [1]  # re-mapped, never reloaded


def _set_faults(url: str, **faults: int) -> dict:
    response = oneshot_http.post(f"{url}/admin/faults", json=faults, timeout=5)
    response.raise_for_status()
    return response.json()


def test_stream_behind_a_gateway_continues_on_the_restarted_engine(fleet_factory):
    """victim dies after 5 tokens → survivor serves 6 and hangs → victim is back on the holder's
    weights → survivor is SIGKILLed → the gateway continues on the restarted victim."""
    fleet = fleet_factory()
    holder = fleet.start_holder()
    gateway = GatewayProcess(gateway_config(fleet.model, recovery={"stall_timeout": 60.0}), free_port(),
                             fleet.workdir / "gateway")
    try:
        gateway.start()
        gateway.wait_live()
        attached = ["--holder", holder.url, *gateway.registry_args()]
        survivor = fleet.start_engine("survivor", [*attached, "--enable-fault-admin"])
        victim = fleet.start_engine("victim", [*attached, "--fault-exit-after-tokens", "5"])
        gateway.wait_routable("tiny", 2)
        greedy = {"model": "tiny", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True,
                  "return_token_ids": True}
        expected = direct_tokens(survivor.url, fleet.model, greedy)
        sent = oneshot_http.get(f"{survivor.url}/admin/faults", timeout=5).json()["tokens_sent"]
        _set_faults(survivor.url, hang_after_tokens=sent + 6)
        victim_generation = gateway.leases()["victim"]

        results: list[StreamResult | BaseException] = []

        def client() -> None:
            try:
                results.append(stream(gateway.url, greedy, {"X-Lifeline-Prefer-Instance": "victim"}))
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                results.append(exc)

        thread = threading.Thread(target=client, daemon=True)
        thread.start()
        victim.process.wait(timeout=60)
        assert victim.process.returncode == 137  # the fault killed it after 5 tokens
        wait_for(lambda: oneshot_http.get(f"{survivor.url}/admin/faults", timeout=5).json()["tokens_sent"] == sent + 6,
                 "the survivor to hang after 6 tokens")

        restarted = fleet.start_engine("victim", attached)
        gateway.wait_generation_above("victim", victim_generation)
        origin = weights_origin(restarted)
        assert (origin["source"], origin["takeover"]) == ("holder", True)
        survivor.kill(signal.SIGKILL)
        thread.join(timeout=120)

        [result] = results
        assert not isinstance(result, BaseException), result
        assert result.error is None, result.error
        assert result.token_ids == expected
        assert result.seqs == list(range(len(result.seqs)))
        assert result.done and result.finish_reason == "length"
        assert result.epochs[-1] == 2  # victim → survivor → restarted victim
        by_epoch = {e: sum(len(c["choices"][0].get("token_ids") or []) for c in result.chunks
                           if c["lifeline"]["epoch"] == e and c["choices"]) for e in (0, 1, 2)}
        assert by_epoch == {0: 5, 1: 6, 2: MAX_TOKENS - 11}
    finally:
        gateway.kill()
