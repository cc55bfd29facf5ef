"""KV export and import over HTTP between real engine processes.

Promise tested: cheaper semantic recovery, and "a miss, never a misuse". Blocks exported by one
engine and imported by another let the second prefill only the tail of a continuation, with
exactly the tokens of an undisturbed run. Engines of another model version, dtype or block size
refuse the same bundle with a typed 409 naming the field; a bundle with a flipped byte is a 400,
one over the size limit a 413; every refusal leaves the prefix cache as it was.
"""

from __future__ import annotations

import httpx
import pytest

from common import oneshot_http
from lifeline.processes import built_model
from tests.e2e.kv.conftest import PROMPT, kv_summary, log_records, metric, prompt_ids, tokens

BLOCK = 16
ADMIN = ["--enable-kv-admin"]


@pytest.fixture(scope="module")
def engines(module_engine_factory):
    start = module_engine_factory
    return {
        "source": start("kv-source", extra_args=ADMIN),
        "target": start("kv-target", extra_args=[*ADMIN, "--kv-import-max-bytes", str(4 << 20)]),
        "seed1": start("kv-seed1", model=built_model("tiny", 1), extra_args=ADMIN),
        "float32": start("kv-float32", extra_args=[*ADMIN, "--dtype", "float32"]),
        "block8": start("kv-block8", extra_args=[*ADMIN, "--kv-block-tokens", "8"]),
    }


def export(engine, token_ids: list[int]) -> httpx.Response:
    return oneshot_http.post(f"{engine.url}/admin/kv/export", json={"token_ids": token_ids}, timeout=60)


def import_(engine, bundle: bytes) -> httpx.Response:
    return oneshot_http.post(f"{engine.url}/admin/kv/import", content=bundle, timeout=60,
                             headers={"content-type": "application/octet-stream"})


def test_exported_blocks_let_another_engine_prefill_only_the_tail(engines):
    source, target = engines["source"], engines["target"]
    ids = prompt_ids(source, PROMPT)
    expected = tokens(source, PROMPT, 30)
    continuation = ids + expected[:12]
    exported = export(source, continuation)
    assert exported.status_code == 200, exported.text
    # The source cached every full block of prompt and output: all of the continuation's full blocks.
    blocks = len(continuation) // BLOCK
    assert int(exported.headers["X-Lifeline-KV-Blocks"]) == blocks
    assert exported.headers["X-Lifeline-KV-Root"] == kv_summary(target)["root_hash"]  # same tuple, same root

    imported = import_(target, exported.content)
    assert imported.status_code == 200, imported.text
    assert imported.json()["blocks"] == blocks
    prefilled_before = metric(target, "vllm:prompt_tokens_total")
    reused_before = metric(target, "lifeline_engine_kv_reused_tokens_total")
    rest = tokens(target, continuation, 18)
    assert expected[:12] + rest == expected
    restored = (len(continuation) - 1) // BLOCK * BLOCK
    assert metric(target, "lifeline_engine_kv_reused_tokens_total") - reused_before == restored
    assert metric(target, "vllm:prompt_tokens_total") - prefilled_before == len(continuation) - restored
    assert log_records(target, "prompt prefilled after restored kv")[-1]["prefilled_tokens"] == len(continuation) - restored


@pytest.mark.parametrize("other, field", [("seed1", "weights_digest"), ("float32", "layout.dtype"),
                                          ("block8", "layout.block_tokens")])
def test_engines_under_another_tuple_refuse_the_bundle_and_keep_their_cache(engines, other, field):
    source, engine = engines["source"], engines[other]
    ids = prompt_ids(source, PROMPT)
    tokens(source, PROMPT, 4)
    bundle = export(source, ids).content
    before = kv_summary(engine)["prefix_cache"]
    refused = import_(engine, bundle)
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["type"] == "kv_validity_mismatch"
    assert field in error["message"]
    assert kv_summary(engine)["prefix_cache"] == before
    assert metric(engine, "lifeline_engine_kv_imports_total", {"source": "http", "outcome": "refused_validity"}) >= 1
    assert kv_summary(engine)["root_hash"] != kv_summary(source)["root_hash"]


def test_a_corrupt_bundle_a_huge_one_and_an_unknown_prefix_are_refused_typed(engines):
    source, target = engines["source"], engines["target"]
    ids = prompt_ids(source, PROMPT)
    tokens(source, PROMPT, 4)
    bundle = bytearray(export(source, ids).content)
    bundle[-100] ^= 0x04  # inside the last block's tensor
    before = kv_summary(target)["prefix_cache"]
    refused = import_(target, bytes(bundle))
    assert refused.status_code == 400 and refused.json()["error"]["type"] == "kv_checkpoint_invalid", refused.text
    garbage = import_(target, b"not safetensors")
    assert garbage.status_code == 400 and garbage.json()["error"]["type"] == "kv_checkpoint_invalid"
    huge = import_(target, b"\0" * (5 << 20))
    assert huge.status_code == 413 and huge.json()["error"]["type"] == "kv_import_too_large"
    assert kv_summary(target)["prefix_cache"] == before

    unknown = export(source, [7] * 40)
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "kv_blocks_absent"
    bad = oneshot_http.post(f"{source.url}/admin/kv/export", json={"token_ids": []}, timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "BadRequestError"


def test_a_checkpoint_of_token_ids_outside_the_vocabulary_is_refused_and_writes_nothing(engine_factory, tmp_path):
    store = tmp_path / "kv"
    engine = engine_factory("kv-checkpointer", extra_args=[*ADMIN, "--kv-checkpoint-store", f"file://{store}"])
    for bad in (10**9, -1):  # past the embedding; and a negative id, which would index it from its end
        response = oneshot_http.post(f"{engine.url}/admin/kv/checkpoint", json={"token_ids": [1] * 20 + [bad] * 12},
                                     timeout=30)
        assert (response.status_code, response.json()["error"]["param"]) == (400, "token_ids"), bad
        assert "outside the vocabulary" in response.json()["error"]["message"]
    assert not store.exists() or not any(store.rglob("*"))
    written = oneshot_http.post(f"{engine.url}/admin/kv/checkpoint", json={"token_ids": [1] * 32}, timeout=30)
    assert written.status_code == 200, written.text
