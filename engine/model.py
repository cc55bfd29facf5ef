"""A LLaMA forward pass in plain torch, with a per-sequence KV cache.

Written out rather than taken from transformers so the engine controls the
two things serving needs: a KV cache sized per request, and a decode step
that batches every running sequence's projections and MLP into one matmul
(attention stays per sequence, since their lengths differ). A test checks the
logits against transformers' LlamaForCausalLM on the same files.

Computation defaults to float64: greedy continuation from a committed prefix
must pick the same argmax whether the prefix was decoded step by step or
prefilled in one pass, and float32 rounding differs between those shapes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


@dataclass(frozen=True)
class LlamaShape:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_positions: int
    rms_norm_eps: float
    rope_theta: float
    bos_token_id: int
    eos_token_id: int

    @classmethod
    def from_config(cls, config: dict) -> LlamaShape:
        rope_theta = config.get("rope_theta") or config.get("rope_parameters", {}).get("rope_theta", 10000.0)
        return cls(
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=config["num_attention_heads"],
            num_kv_heads=config.get("num_key_value_heads", config["num_attention_heads"]),
            head_dim=config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"],
            max_positions=config["max_position_embeddings"],
            rms_norm_eps=config.get("rms_norm_eps", 1e-5),
            rope_theta=float(rope_theta),
            bos_token_id=config["bos_token_id"],
            eos_token_id=config["eos_token_id"],
        )


class KVCache:
    """Keys and values of one sequence, allocated once for its whole length."""

    def __init__(self, shape: LlamaShape, capacity: int, dtype: torch.dtype) -> None:
        size = (shape.num_layers, shape.num_kv_heads, capacity, shape.head_dim)
        self.keys = torch.empty(size, dtype=dtype)
        self.values = torch.empty(size, dtype=dtype)
        self.length = 0
        self.capacity = capacity


def load_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    weights: dict[str, torch.Tensor] = {}
    for filename in sorted(set(index["weight_map"].values())):
        weights.update(load_file(str(model_dir / filename)))
    missing = set(index["weight_map"]) - set(weights)
    if missing:
        raise ValueError(f"weights missing from shards: {sorted(missing)[:5]}")
    return weights


class LlamaModel:
    def __init__(self, shape: LlamaShape, weights: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
        self.shape = shape
        self.dtype = dtype
        self.w = {name: tensor.to(dtype) for name, tensor in weights.items()}
        inv_freq = 1.0 / (
            shape.rope_theta ** (torch.arange(0, shape.head_dim, 2, dtype=torch.float64) / shape.head_dim)
        )
        angles = torch.outer(torch.arange(shape.max_positions, dtype=torch.float64), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.cos = angles.cos().to(dtype)
        self.sin = angles.sin().to(dtype)

    @classmethod
    def load(cls, model_dir: Path, dtype: torch.dtype = torch.float64) -> LlamaModel:
        config = json.loads((model_dir / "config.json").read_text())
        return cls(LlamaShape.from_config(config), load_weights(model_dir), dtype)

    @classmethod
    def from_weights(cls, model_dir: Path, weights: dict[str, torch.Tensor], dtype: torch.dtype) -> LlamaModel:
        """A model over weights someone else holds (engine.holder_client): no copy when dtypes match."""
        config = json.loads((model_dir / "config.json").read_text())
        return cls(LlamaShape.from_config(config), weights, dtype)

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache(self.shape, capacity, self.dtype)

    # -- building blocks -------------------------------------------------
    def _rms_norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(variance + self.shape.rms_norm_eps) * self.w[name]

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x: [..., heads, T, head_dim]; positions: [T] or [B, 1, 1]
        cos, sin = self.cos[positions], self.sin[positions]
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def _mlp(self, x: torch.Tensor, p: str) -> torch.Tensor:
        gate = F.silu(x @ self.w[p + "mlp.gate_proj.weight"].T)
        up = x @ self.w[p + "mlp.up_proj.weight"].T
        return (gate * up) @ self.w[p + "mlp.down_proj.weight"].T

    def _qkv(self, x: torch.Tensor, p: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s = self.shape
        lead = x.shape[:-1]  # [T] for prefill, [B] for decode
        q = (x @ self.w[p + "self_attn.q_proj.weight"].T).view(*lead, s.num_heads, s.head_dim)
        k = (x @ self.w[p + "self_attn.k_proj.weight"].T).view(*lead, s.num_kv_heads, s.head_dim)
        v = (x @ self.w[p + "self_attn.v_proj.weight"].T).view(*lead, s.num_kv_heads, s.head_dim)
        return q, k, v

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self._rms_norm(x, "model.norm.weight") @ self.w["lm_head.weight"].T

    # -- passes ------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, token_ids: list[int], cache: KVCache) -> torch.Tensor:
        """Run the prompt into the cache after the positions it already holds; the last position's logits.

        A cache that already holds a prefix (KV blocks restored from the holder, engine.kv_pool)
        is extended: the new positions attend to the held ones through an explicit causal mask.
        """
        s = self.shape
        count = len(token_ids)
        start = cache.length
        if count == 0 or start + count > cache.capacity:
            raise ValueError("prefill needs at least one token and a cache large enough for the prompt")
        positions = torch.arange(start, start + count)
        end = start + count
        mask = None if start == 0 else torch.ones(count, end, dtype=torch.bool).tril(diagonal=start)
        x = self.w["model.embed_tokens.weight"][torch.tensor(token_ids)]
        for layer in range(s.num_layers):
            p = f"model.layers.{layer}."
            q, k, v = self._qkv(self._rms_norm(x, p + "input_layernorm.weight"), p)
            q = self._rope(q.transpose(0, 1), positions)  # [heads, T, d]
            k = self._rope(k.transpose(0, 1), positions)
            v = v.transpose(0, 1)
            cache.keys[layer, :, start:end] = k
            cache.values[layer, :, start:end] = v
            # 4-D inputs let torch pick its fused CPU kernel; 3-D ones fall back to the math path.
            if mask is None:
                attn = F.scaled_dot_product_attention(
                    q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), is_causal=True, enable_gqa=True
                )[0]
            else:
                attn = F.scaled_dot_product_attention(
                    q.unsqueeze(0), cache.keys[layer, :, :end].unsqueeze(0), cache.values[layer, :, :end].unsqueeze(0),
                    attn_mask=mask, enable_gqa=True,
                )[0]
            x = x + attn.transpose(0, 1).reshape(count, -1) @ self.w[p + "self_attn.o_proj.weight"].T
            x = x + self._mlp(self._rms_norm(x, p + "post_attention_layernorm.weight"), p)
        cache.length = end
        return self._logits(x[-1])

    @torch.inference_mode()
    def decode(self, token_ids: list[int], caches: list[KVCache]) -> torch.Tensor:
        """One step for a batch of sequences, each with its own cache; logits [B, vocab]."""
        s = self.shape
        batch = len(token_ids)
        positions = torch.tensor([c.length for c in caches])
        if any(c.length >= c.capacity for c in caches):
            raise ValueError("a sequence outgrew its KV cache")
        x = self.w["model.embed_tokens.weight"][torch.tensor(token_ids)]  # [B, hidden]
        rope_positions = positions.view(batch, 1, 1)
        for layer in range(s.num_layers):
            p = f"model.layers.{layer}."
            q, k, v = self._qkv(self._rms_norm(x, p + "input_layernorm.weight"), p)  # [B, heads, d]
            q = self._rope(q.unsqueeze(2), rope_positions).squeeze(2)
            k = self._rope(k.unsqueeze(2), rope_positions).squeeze(2)
            outputs = []
            for b, cache in enumerate(caches):
                pos = cache.length
                cache.keys[layer, :, pos] = k[b]
                cache.values[layer, :, pos] = v[b]
                keys = cache.keys[layer, :, : pos + 1].unsqueeze(0)
                values = cache.values[layer, :, : pos + 1].unsqueeze(0)
                outputs.append(F.scaled_dot_product_attention(q[b].view(1, -1, 1, s.head_dim), keys, values, enable_gqa=True)[0])
            attn = torch.stack(outputs).reshape(batch, -1)
            x = x + attn @ self.w[p + "self_attn.o_proj.weight"].T
            x = x + self._mlp(self._rms_norm(x, p + "post_attention_layernorm.weight"), p)
        for cache in caches:
            cache.length += 1
        return self._logits(x)
