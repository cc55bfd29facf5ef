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

    @property
    def parameter_count(self) -> int:
        """Parameters of the LLaMA model this preset builds (untied output head)."""
        head_dim = self.hidden_size // self.num_attention_heads
        kv = self.num_key_value_heads * head_dim
        attention = 2 * self.hidden_size * self.hidden_size + 2 * kv * self.hidden_size
        mlp = 3 * self.hidden_size * self.intermediate_size
        per_layer = attention + mlp + 2 * self.hidden_size
        return 2 * self.vocab_size * self.hidden_size + self.num_hidden_layers * per_layer + self.hidden_size


PRESETS: dict[str, ModelPreset] = {
    "tiny": ModelPreset("tiny", 4096, 256, 688, 4, 4, 2, 4096, 2),
    "small": ModelPreset("small", 4096, 896, 3072, 10, 14, 2, 4096, 4),
}


def get_preset(name: str) -> ModelPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}") from None
