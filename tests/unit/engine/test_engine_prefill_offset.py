"""Prefill after a held prefix (KV restored from the holder) gives the logits a full prefill gives."""

from __future__ import annotations

import pytest
import torch

from engine.model import LlamaModel
from lifeline.processes import built_model


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    torch.set_num_threads(1)
    return LlamaModel.load(built_model("tiny", 0), torch.float64)


def greedy(model: LlamaModel, prompt: list[int], held: int, steps: int) -> tuple[torch.Tensor, list[int]]:
    cache = model.new_cache(len(prompt) + steps)
    if held:
        model.prefill(prompt[:held], cache)  # stands in for blocks copied from the pool
    logits = model.prefill(prompt[held:], cache)
    first = logits
    tokens = []
    for _ in range(steps):
        tokens.append(int(logits.argmax()))
        logits = model.decode([tokens[-1]], [cache])[0]
    return first, tokens


@pytest.mark.parametrize("held", [16, 32, 47])
def test_prefill_after_a_held_prefix_matches_a_full_prefill(model, held):
    prompt = [(i * 37 + 11) % model.shape.vocab_size for i in range(48)]
    full_logits, full_tokens = greedy(model, prompt, 0, 16)
    logits, tokens = greedy(model, prompt, held, 16)
    torch.testing.assert_close(logits, full_logits, rtol=0, atol=1e-9)
    assert tokens == full_tokens


def test_prefill_refuses_an_empty_chunk_or_an_overfull_cache(model):
    cache = model.new_cache(4)
    with pytest.raises(ValueError):
        model.prefill([], cache)
    with pytest.raises(ValueError):
        model.prefill([1, 2, 3, 4, 5], cache)
