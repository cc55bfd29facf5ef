"""SIGKILL the engine serving a stream; a second engine process sharing the checkpoint store continues it.

Promise tested: semantic recovery, cheaper with checkpoints. The survivor is sent what the gateway's
migration sends, `prompt ‖ committed`, and must produce exactly the tokens of an undisturbed run:

- checkpoints off: it prefills every position;
- checkpoints on (Redis as the regional store): it imports the dead engine's last checkpoint (every
  8 committed tokens, full blocks only) and prefills only the positions after it;
- a corrupted checkpoint (a flipped byte in a block, or a manifest claiming another validity tuple)
  is refused, logged with the request id, and recomputed: never used.
"""

from __future__ import annotations

import json
import signal
import uuid

import pytest
import redis

from common import oneshot_http
from contract.kv_checkpoint import KVCheckpointStore, open_kv_store
from tests.e2e.kv.conftest import PROMPT, log_records, metric, prompt_ids, tokens
from tests.e2e.holder.conftest import fleet_factory, wait_for, weights_origin  # noqa: F401 - fleet_factory: a fixture

BLOCK = 16
EVERY = 8
MAX_TOKENS = 32
KILL_AFTER = 20  # the last checkpoint due before it is at 16 tokens
REDIS = "redis://127.0.0.1:6379/0"


@pytest.fixture(scope="module")
def undisturbed(module_engine_factory) -> tuple[list[int], list[int]]:
    reference = module_engine_factory("kv-reference")
    return prompt_ids(reference, PROMPT), tokens(reference, PROMPT, MAX_TOKENS)


@pytest.fixture
def store_url():
    prefix = f"test:kv-failover:{uuid.uuid4().hex}:"
    yield f"{REDIS}?key_prefix={prefix}&socket_timeout=5"
    client = redis.Redis.from_url(REDIS)
    for key in client.scan_iter(match=prefix + "*"):
        client.delete(key)


def stream_then_kill(engine, checkpoint_blocks: int | None) -> list[int]:
    """Stream PROMPT from `engine`, SIGKILL it once KILL_AFTER tokens arrived (and, with checkpoints,
    once it wrote `checkpoint_blocks` blocks); the tokens the client holds."""
    body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True, "stream": True,
            "return_token_ids": True}
    committed: list[int] = []
    with oneshot_http.stream("POST", f"{engine.url}/v1/completions", json=body, timeout=60,
                             headers={"X-Request-Id": "kv-failover-1"}) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                committed.extend(json.loads(line[6:])["choices"][0].get("token_ids") or [])
            if len(committed) >= KILL_AFTER:
                if checkpoint_blocks is not None:
                    wait_for(lambda: metric(engine, "lifeline_engine_kv_checkpoint_blocks_total") >= checkpoint_blocks,
                             "checkpoint written", timeout=30)
                engine.kill(signal.SIGKILL)
                break
    assert engine.process.returncode == -signal.SIGKILL
    return committed[:KILL_AFTER]


def corrupt(store_url: str, how: str) -> None:
    store = open_kv_store(store_url)
    checkpoints = KVCheckpointStore(store)
    [newest] = sorted(checkpoints.manifests(), key=lambda k: len(store.get(k)))[-1:]
    body = json.loads(store.get(newest))
    if how == "checksum":
        block = f"{newest.split('/manifests/')[0]}/blocks/{body['blocks'][-1]['hash']}.safetensors"
        data = bytearray(store.get(block))
        data[-7] ^= 0x20
        store.put(block, bytes(data))
    else:  # the same blocks, claimed for another weight version
        body["validity"]["weights_digest"] = "0" * 64
        store.put(newest, json.dumps(body).encode())


@pytest.mark.parametrize("checkpoints", ["off", "on", "corrupt-checksum", "corrupt-tuple"])
def test_survivor_continues_token_identically_and_imports_instead_of_prefilling(
        engine_factory, undisturbed, store_url, checkpoints):
    ids, expected = undisturbed
    shared = [] if checkpoints == "off" else ["--kv-checkpoint-store", store_url, "--kv-checkpoint-every", str(EVERY)]
    victim = engine_factory("kv-victim", extra_args=[*shared, "--fault-token-delay-ms", "150"])
    survivor = engine_factory("kv-survivor", extra_args=shared)
    # At the 16th committed token the victim's cache held len(prompt) + 15 positions: that many full blocks.
    checkpoint_blocks = (len(ids) + 2 * EVERY - 1) // BLOCK
    committed = stream_then_kill(victim, None if checkpoints == "off" else checkpoint_blocks)
    assert committed == expected[:KILL_AFTER]
    if checkpoints.startswith("corrupt-"):
        corrupt(store_url, checkpoints.removeprefix("corrupt-"))

    continuation = ids + committed
    prefilled_before = metric(survivor, "vllm:prompt_tokens_total")
    response = oneshot_http.post(f"{survivor.url}/v1/completions", timeout=120, headers={"X-Request-Id": "kv-failover-1"},
                                 json={"prompt": continuation, "max_tokens": MAX_TOKENS - KILL_AFTER, "temperature": 0.0,
                                "ignore_eos": True, "return_token_ids": True})
    response.raise_for_status()
    rest = response.json()["choices"][0]["token_ids"]
    assert committed + rest == expected  # token-identical to the undisturbed run, in every case

    imported = metric(survivor, "lifeline_engine_kv_imported_tokens_total")
    prefilled = metric(survivor, "vllm:prompt_tokens_total") - prefilled_before
    if checkpoints == "on":
        assert imported == checkpoint_blocks * BLOCK
        assert prefilled == len(continuation) - checkpoint_blocks * BLOCK
        [record] = [r for r in log_records(survivor, "prompt prefilled after restored kv")
                    if r["request_id"] == "cmpl-kv-failover-1"]
        assert (record["imported_tokens"], record["prefilled_tokens"], record["cached_tokens"]) == (
            imported, prefilled, 0)
    else:
        assert imported == 0
        assert prefilled == len(continuation)
    if checkpoints.startswith("corrupt-"):
        reason = "refused_invalid" if checkpoints == "corrupt-checksum" else "refused_validity"
        assert metric(survivor, "lifeline_engine_kv_imports_total", {"source": "store", "outcome": reason}) == 1
        [refusal] = log_records(survivor, "kv checkpoint refused; prefilling instead")
        assert refusal["request_id"] == "cmpl-kv-failover-1"


def test_a_survivor_with_a_holder_imports_into_the_holders_pool(fleet_factory, undisturbed, store_url):
    """The same failover when the survivor's prefix cache is a memory holder's KV pool: the imported blocks
    are committed to the holder, found by the restore, and the tokens are still exact."""
    ids, expected = undisturbed
    fleet = fleet_factory()
    shared = ["--kv-checkpoint-store", store_url, "--kv-checkpoint-every", str(EVERY)]
    holder = fleet.start_holder(extra_args=["--kv-blocks", "64", "--kv-block-tokens", str(BLOCK)])
    victim = fleet.start_engine("kv-victim", [*shared, "--fault-token-delay-ms", "150"])
    survivor = fleet.start_engine("kv-survivor", [*shared, "--holder", holder.url])
    assert weights_origin(survivor)["kv_pool"] is True
    checkpoint_blocks = (len(ids) + 2 * EVERY - 1) // BLOCK
    committed = stream_then_kill(victim, checkpoint_blocks)
    assert committed == expected[:KILL_AFTER]

    committed_before = holder.state()["kv"]["committed"]
    response = oneshot_http.post(f"{survivor.url}/v1/completions", timeout=120,
                                 json={"prompt": ids + committed, "max_tokens": MAX_TOKENS - KILL_AFTER, "temperature": 0.0,
                                "ignore_eos": True, "return_token_ids": True})
    response.raise_for_status()
    assert committed + response.json()["choices"][0]["token_ids"] == expected
    assert metric(survivor, "lifeline_engine_kv_imported_tokens_total") == checkpoint_blocks * BLOCK
    assert holder.state()["kv"]["committed"] - committed_before >= checkpoint_blocks


@pytest.mark.parametrize("backend", ["filesystem", "s3"])
def test_the_store_may_be_a_directory_or_s3(engine_factory, undisturbed, tmp_path, monkeypatch, request, backend):
    """The same failover with checkpoints on, through the other two backends (S3: moto's emulator)."""
    ids, expected = undisturbed
    if backend == "filesystem":
        store = ["--kv-checkpoint-store", str(tmp_path / "kv-store")]
    else:
        moto = request.getfixturevalue("moto_s3")
        for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                            "AWS_DEFAULT_REGION": "us-east-1"}.items():
            monkeypatch.setenv(name, value)  # inherited by the engine processes
        bucket = f"kv-{uuid.uuid4().hex[:12]}"
        moto.client().create_bucket(Bucket=bucket)
        store = ["--kv-checkpoint-store", f"s3://{bucket}/region-a", "--kv-checkpoint-s3-endpoint-url",
                 moto.endpoint_url]
    shared = [*store, "--kv-checkpoint-every", str(EVERY)]
    victim = engine_factory("kv-victim", extra_args=[*shared, "--fault-token-delay-ms", "150"])
    survivor = engine_factory("kv-survivor", extra_args=shared)
    checkpoint_blocks = (len(ids) + 2 * EVERY - 1) // BLOCK
    committed = stream_then_kill(victim, checkpoint_blocks)
    response = oneshot_http.post(f"{survivor.url}/v1/completions", timeout=120,
                                 json={"prompt": ids + committed, "max_tokens": MAX_TOKENS - KILL_AFTER, "temperature": 0.0,
                                "ignore_eos": True, "return_token_ids": True})
    response.raise_for_status()
    assert committed + response.json()["choices"][0]["token_ids"] == expected
    assert metric(survivor, "lifeline_engine_kv_imported_tokens_total") == checkpoint_blocks * BLOCK
