"""Position-keyed sampling: the draw for position i depends on (seed, i) only."""

from __future__ import annotations

import torch

from engine.sampling import SamplingParams, position_uniform, sample_token


def test_uniform_depends_on_seed_and_position_only() -> None:
    assert position_uniform(7, 100) == position_uniform(7, 100)
    draws = {position_uniform(7, p) for p in range(1000)}
    assert len(draws) == 1000
    assert all(0.0 <= u < 1.0 for u in draws)
    assert position_uniform(7, 5) != position_uniform(8, 5)


def test_seeded_sample_is_reproducible_and_spreads() -> None:
    logits = torch.zeros(50, dtype=torch.float64)
    params = SamplingParams(temperature=1.0, seed=3)
    picks = [sample_token(logits, params, 3, p) for p in range(400)]
    assert picks == [sample_token(logits, params, 3, p) for p in range(400)]
    assert len(set(picks)) > 30  # uniform logits: draws cover most of the vocabulary


def test_greedy_takes_argmax() -> None:
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    assert sample_token(logits, SamplingParams(temperature=0.0), 0, 0) == 1


def test_top_k_and_top_p_restrict_the_support() -> None:
    logits = torch.tensor([5.0, 4.0, 3.0, 0.0, -1.0], dtype=torch.float64)
    top_k = {sample_token(logits, SamplingParams(temperature=5.0, top_k=2), 1, p) for p in range(300)}
    assert top_k == {0, 1}
    top_p = {sample_token(logits, SamplingParams(temperature=1.0, top_p=0.5), 1, p) for p in range(300)}
    assert top_p == {0}
