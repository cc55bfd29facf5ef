"""Token selection that survives migration.

Greedy picks the argmax. Seeded sampling draws the token for absolute
position `i` from a uniform number keyed by `(seed, i)` alone — not from a
generator that advanced through earlier positions — so a request resumed
elsewhere as `prompt ‖ committed tokens` draws exactly what the original
engine would have drawn for the remaining positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MASK64 = (1 << 64) - 1


def _splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def position_uniform(seed: int, position: int) -> float:
    """A uniform float in [0, 1) determined only by (seed, position)."""
    mixed = _splitmix64(_splitmix64(seed & _MASK64) ^ (position & _MASK64))
    return (mixed >> 11) / float(1 << 53)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def sample_token(logits: torch.Tensor, params: SamplingParams, seed: int, position: int) -> int:
    """Pick the token at `position` from 1-D `logits`."""
    if params.greedy:
        return int(torch.argmax(logits).item())
    logits = logits.to(torch.float64) / params.temperature
    # Stable order: by probability, ties by token id, so the CDF is the same on every engine.
    order = torch.argsort(-logits, stable=True)
    sorted_logits = logits[order]
    if params.top_k > 0:
        sorted_logits = sorted_logits[: params.top_k]
        order = order[: params.top_k]
    probs = torch.softmax(sorted_logits, dim=-1)
    if params.top_p < 1.0:
        cumulative = torch.cumsum(probs, dim=-1)
        keep = int(torch.searchsorted(cumulative, torch.tensor(params.top_p, dtype=probs.dtype)).item()) + 1
        probs = probs[:keep] / probs[:keep].sum()
        order = order[:keep]
    cumulative = torch.cumsum(probs, dim=-1)
    u = position_uniform(seed, position) * float(cumulative[-1])
    index = int(torch.searchsorted(cumulative, torch.tensor(u, dtype=cumulative.dtype), right=True).item())
    return int(order[min(index, len(order) - 1)].item())
