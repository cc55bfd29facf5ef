"""KV blocks outlive the engine: a restarted engine prefills only what the pool cannot vouch for.

Promise tested: semantic recovery at lower cost. After a SIGKILL mid-stream,
the continuation `prompt ‖ committed` on the restarted engine restores every
full block the dead engine committed, prefills the rest, and yields exactly
the tokens of an undisturbed run on disk-loaded weights. A block whose bytes
no longer match its checksum is discarded by the holder, never used: the
engine prefills from there and the tokens are still exact.
"""

from __future__ import annotations

import json
import signal

from common import oneshot_http
from lifeline.processes import scrape_metric
from tests.e2e.holder.conftest import completion_tokens, prompt_ids, wait_for, weights_origin

BLOCK = 16
MAX_TOKENS = 24
KILL_AFTER = 9
PROMPT = ("Every region keeps a warm pool; when one zone is lost the gateway moves each stream to another "
          "engine, which continues from the committed prefix without a gap or a duplicate token. ") * 2


def metric(engine, name: str) -> float:
    return scrape_metric(f"{engine.url}/metrics", name)


def test_restarted_engine_reuses_committed_kv_blocks_and_never_a_corrupt_one(fleet_factory):
    fleet = fleet_factory()
    reference = fleet.start_engine("reference")  # disk weights, no pool: the undisturbed run
    expected = completion_tokens(reference.url, PROMPT, MAX_TOKENS)
    ids = prompt_ids(reference.url, PROMPT)
    holder = fleet.start_holder(extra_args=["--kv-blocks", "64", "--kv-block-tokens", str(BLOCK)])
    engine = fleet.start_engine("engine-a", ["--holder", holder.url, "--fault-token-delay-ms", "200"])
    assert weights_origin(engine)["kv_pool"] is True

    committed: list[int] = []
    body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True, "stream": True,
            "return_token_ids": True}
    vouched_blocks = (len(ids) + KILL_AFTER - 1) // BLOCK  # positions whose KV exists once 9 tokens are out
    with oneshot_http.stream("POST", f"{engine.url}/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                committed.extend(json.loads(line[6:])["choices"][0].get("token_ids") or [])
            if len(committed) >= KILL_AFTER:
                wait_for(lambda: holder.state()["kv"]["committed"] >= vouched_blocks, "blocks committed")
                engine.kill(signal.SIGKILL)
                break
    committed = committed[:KILL_AFTER]
    assert committed == expected[:KILL_AFTER]

    restarted = fleet.start_engine("engine-a", ["--holder", holder.url])
    assert weights_origin(restarted)["takeover"] is True
    prefilled_before = metric(restarted, "vllm:prompt_tokens_total")
    continuation = completion_tokens(restarted.url, ids + committed, MAX_TOKENS - KILL_AFTER)
    assert committed + continuation == expected
    assert metric(restarted, "lifeline_engine_kv_reused_tokens_total") == vouched_blocks * BLOCK
    assert metric(restarted, "vllm:prompt_tokens_total") - prefilled_before == len(ids) + KILL_AFTER - vouched_blocks * BLOCK

    # One flipped bit in the chain's second block: discarded by the holder, re-prefilled by the engine.
    state = holder.state()
    chain = state["kv"]["committed_blocks"]
    second = chain[1]
    assert second["parent_hash"] == chain[0]["hash"]
    pool = next(r for r in state["regions"] if r["purpose"] == "kv" and r["status"] == "sealed")
    block_bytes = pool["size"] // state["kv"]["blocks"]
    with open(pool["path"], "r+b") as held:
        held.seek(second["block"] * block_bytes + 1000)
        byte = held.read(1)
        held.seek(-1, 1)
        held.write(bytes([byte[0] ^ 0x08]))
    reused_before = metric(restarted, "lifeline_engine_kv_reused_tokens_total")
    again = completion_tokens(restarted.url, ids + committed, MAX_TOKENS - KILL_AFTER)
    assert again == continuation
    assert metric(restarted, "lifeline_engine_kv_reused_tokens_total") - reused_before == BLOCK  # block 0 only
    assert metric(restarted, "lifeline_engine_kv_discarded_blocks_total") == 1
    discarded = [json.loads(line) for line in holder.logs().splitlines() if '"kv block discarded"' in line]
    assert [(d["block"], d["reason"]) for d in discarded] == [(second["block"], "checksum mismatch")]
