"""Model presets of the reference engine.

`tiny` (~5M parameters) keeps tests fast; `small` (~100M) makes re-prefill
cost realistic enough for recovery benchmarks to mean something.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelPreset:
    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    num_shards: int


PRESETS: dict[str, ModelPreset] = {
    "tiny": ModelPreset("tiny", 4096, 256, 688, 4, 4, 2, 4096, 2),
    "small": ModelPreset("small", 4096, 896, 3072, 10, 14, 2, 4096, 4),
}


def get_preset(name: str) -> ModelPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}") from None
