"""The gateway's migration, unchanged, imports instead of re-prefilling once engines share a checkpoint store.

Promise tested: semantic recovery (token-identical, contiguous `seq`) at a lower cost. A stream is
pinned to a victim engine behind a real gateway; the victim is SIGKILLed after it checkpointed; the
gateway migrates `prompt ‖ committed` to the survivor, which imports the victim's last checkpoint and
prefills only the tail since it. The gateway knows nothing of checkpoints.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid

import pytest
import redis

from lifeline.processes import gateway_config
from tests.e2e.gateway.conftest import cluster_factory, stream  # noqa: F401 - cluster_factory: a fixture
from tests.e2e.kv.conftest import PROMPT, metric, prompt_ids, tokens

BLOCK = 16
EVERY = 8
MAX_TOKENS = 40
REDIS = "redis://127.0.0.1:6379/0"


@pytest.fixture
def store_url():
    prefix = f"test:kv-gateway:{uuid.uuid4().hex}:"
    yield f"{REDIS}?key_prefix={prefix}&socket_timeout=5"
    client = redis.Redis.from_url(REDIS)
    for key in client.scan_iter(match=prefix + "*"):
        client.delete(key)


def test_gateway_migration_imports_the_victims_checkpoint(cluster_factory, store_url):
    cluster = cluster_factory()
    cluster.start_gateway(gateway_config(cluster.model, recovery={"stall_timeout": 1.0}))
    reference = cluster.start_engine("kv-reference", registry=[])  # not routable: the undisturbed run only
    ids = prompt_ids(reference, PROMPT)
    expected = tokens(reference, PROMPT, MAX_TOKENS)
    shared = ["--kv-checkpoint-store", store_url, "--kv-checkpoint-every", str(EVERY)]
    survivor = cluster.start_engine("kv-survivor", shared)
    victim = cluster.start_engine("kv-victim", [*shared, "--fault-token-delay-ms", "150"])
    cluster.gateway.wait_routable("tiny", 2)

    # Kill once the victim has checkpointed past its 16th generated token (prompt + 15 positions).
    wanted_blocks = (len(ids) + 2 * EVERY - 1) // BLOCK
    killed = threading.Event()

    def kill_when_checkpointed() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if metric(victim, "lifeline_engine_kv_checkpoint_blocks_total") >= wanted_blocks:
                    victim.kill(signal.SIGKILL)
                    killed.set()
                    return
            except Exception:  # noqa: BLE001 - the victim may be between answers; poll again
                pass
            time.sleep(0.05)

    prefilled_before = metric(survivor, "vllm:prompt_tokens_total")  # its self-test prompt
    watcher = threading.Thread(target=kill_when_checkpointed, daemon=True)
    watcher.start()
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True,
            "return_token_ids": True}
    result = stream(cluster.gateway.url, body, {"X-Lifeline-Prefer-Instance": "kv-victim"})
    watcher.join(timeout=5)
    assert killed.is_set()
    assert result.error is None, result.error
    assert result.token_ids == expected
    assert result.seqs == list(range(len(result.seqs)))
    assert result.epochs[-1] == 1  # one migration
    by_victim = sum(len(c["choices"][0].get("token_ids") or []) for c in result.chunks
                    if c["lifeline"]["epoch"] == 0 and c["choices"])
    continuation = len(ids) + by_victim
    imported = metric(survivor, "lifeline_engine_kv_imported_tokens_total")
    prefilled = metric(survivor, "vllm:prompt_tokens_total") - prefilled_before
    assert imported >= wanted_blocks * BLOCK
    assert imported + prefilled == continuation
    assert 0 < prefilled < EVERY + 2 * BLOCK  # the tail since the last checkpoint, not the whole prefix
