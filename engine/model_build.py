"""`lifeline model build`: a deterministic LLaMA-style model on disk.

The output is what a Hugging Face LLaMA checkpoint looks like, so vLLM could
load it too: `config.json` (transformers' LlamaConfig), sharded safetensors
with `model.safetensors.index.json`, `tokenizer.json` (byte-level BPE trained
with `tokenizers`), `tokenizer_config.json` carrying the chat template, and
`generation_config.json`. Same preset and seed give byte-identical files.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.corpus import generate_corpus
from engine.presets import ModelPreset, get_preset

BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
CHAT_TOKENS = ("<|im_start|>", "<|im_end|>")
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, *CHAT_TOKENS)

# ChatML, the format most open chat models use, with Hermes/Qwen-style tool
# calling: offered tools as JSON lines in a system block, an assistant's calls
# as <tool_call> JSON, a tool's result as <tool_response> in a `tool` turn.
# Without tools it renders exactly the plain ChatML it always did. Rendered as
# transformers' apply_chat_template would (common/chat_template.py).
CHAT_TEMPLATE = (
    "{% if tools %}"
    "{{ '<|im_start|>system\n# Tools\nYou may call one or more functions. Their signatures:\n<tools>\n' }}"
    "{% for tool in tools %}{{ tool | tojson }}{{ '\n' }}{% endfor %}"
    "{{ '</tools>\nFor each call, answer with a JSON object of its name and arguments inside <tool_call></tool_call>'"
    " + ' tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>'"
    " + '<|im_end|>\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' and message.tool_calls %}"
    "{{ '<|im_start|>assistant\n' + message['content'] }}"
    "{% for call in message.tool_calls %}"
    "{{ '<tool_call>\n' }}{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}"
    "{{ '\n</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\n' }}"
    "{% elif message['role'] == 'tool' %}"
    "{{ '<|im_start|>tool\n<tool_response>\n' + message['content'] + '\n</tool_response><|im_end|>\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _write_json(path: Path, payload: dict) -> None:
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def build_tokenizer(preset: ModelPreset, out_dir: Path) -> None:
    """Train a byte-level BPE tokenizer whose vocabulary fills the model's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=preset.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(generate_corpus(), trainer=trainer)
    if tokenizer.get_vocab_size() != preset.vocab_size:
        raise RuntimeError(
            f"tokenizer vocabulary is {tokenizer.get_vocab_size()}, preset wants {preset.vocab_size}"
        )
    tokenizer.save(str(out_dir / "tokenizer.json"))
    _write_json(
        out_dir / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS_TOKEN,
            "eos_token": EOS_TOKEN,
            "pad_token": EOS_TOKEN,
            "chat_template": CHAT_TEMPLATE,
            "model_max_length": preset.max_position_embeddings,
            "add_bos_token": False,
        },
    )
    special_tokens_map = {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": EOS_TOKEN}
    _write_json(out_dir / "special_tokens_map.json", special_tokens_map)


def build_config(preset: ModelPreset, bos_id: int, eos_id: int) -> dict:
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=preset.vocab_size,
        hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_hidden_layers,
        num_attention_heads=preset.num_attention_heads,
        num_key_value_heads=preset.num_key_value_heads,
        max_position_embeddings=preset.max_position_embeddings,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        torch_dtype="float32",
    )
    payload = config.to_dict()
    payload["architectures"] = ["LlamaForCausalLM"]
    payload["lifeline_preset"] = preset.name
    return payload


def init_weights(preset: ModelPreset, seed: int) -> dict[str, torch.Tensor]:
    """Random weights, named as transformers names LLaMA's, drawn in a fixed order.

    Projections use std 1/sqrt(fan_in) so every layer shapes the output; the
    output head is scaled so logits spread over several units: a random model
    with near-uniform logits would make greedy decoding hinge on rounding.
    """
    generator = torch.Generator().manual_seed(seed)
    h, inter = preset.hidden_size, preset.intermediate_size
    head_dim = h // preset.num_attention_heads
    kv = preset.num_key_value_heads * head_dim

    def normal(rows: int, cols: int, std: float) -> torch.Tensor:
        return torch.randn(rows, cols, generator=generator, dtype=torch.float32) * std

    weights: dict[str, torch.Tensor] = {"model.embed_tokens.weight": normal(preset.vocab_size, h, 1.0)}
    for i in range(preset.num_hidden_layers):
        p = f"model.layers.{i}."
        weights[p + "self_attn.q_proj.weight"] = normal(h, h, 1 / math.sqrt(h))
        weights[p + "self_attn.k_proj.weight"] = normal(kv, h, 1 / math.sqrt(h))
        weights[p + "self_attn.v_proj.weight"] = normal(kv, h, 1 / math.sqrt(h))
        weights[p + "self_attn.o_proj.weight"] = normal(h, h, 1 / math.sqrt(h))
        weights[p + "mlp.gate_proj.weight"] = normal(inter, h, 1 / math.sqrt(h))
        weights[p + "mlp.up_proj.weight"] = normal(inter, h, 1 / math.sqrt(h))
        weights[p + "mlp.down_proj.weight"] = normal(h, inter, 1 / math.sqrt(inter))
        weights[p + "input_layernorm.weight"] = torch.ones(h)
        weights[p + "post_attention_layernorm.weight"] = torch.ones(h)
    weights["model.norm.weight"] = torch.ones(h)
    weights["lm_head.weight"] = normal(preset.vocab_size, h, 4.0 / math.sqrt(h))
    return weights


def write_shards(weights: dict[str, torch.Tensor], out_dir: Path, num_shards: int) -> None:
    """Split tensors, in order, into `num_shards` files of roughly equal size."""
    names = list(weights)
    total = sum(t.numel() * t.element_size() for t in weights.values())
    target = total / num_shards
    shards: list[list[str]] = [[]]
    size = 0
    for name in names:
        nbytes = weights[name].numel() * weights[name].element_size()
        if size + nbytes > target * len(shards) and shards[-1] and len(shards) < num_shards:
            shards.append([])
        shards[-1].append(name)
        size += nbytes
    if len(shards) < 2:
        raise RuntimeError("a model must span at least two shards")
    weight_map: dict[str, str] = {}
    for index, shard_names in enumerate(shards, start=1):
        filename = f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: weights[n].contiguous() for n in shard_names}, str(out_dir / filename), metadata={"format": "pt"})
        weight_map.update({n: filename for n in shard_names})
    _write_json(
        out_dir / "model.safetensors.index.json",
        {"metadata": {"total_size": total}, "weight_map": weight_map},
    )


def build_model(out_dir: Path, *, preset_name: str, seed: int) -> Path:
    """Write a complete model directory and return it."""
    preset = get_preset(preset_name)
    if seed < 0:
        raise ValueError("seed must be non-negative")
    out_dir.mkdir(parents=True, exist_ok=True)
    build_tokenizer(preset, out_dir)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    bos_id, eos_id = tokenizer.token_to_id(BOS_TOKEN), tokenizer.token_to_id(EOS_TOKEN)
    _write_json(out_dir / "config.json", build_config(preset, bos_id, eos_id))
    _write_json(
        out_dir / "generation_config.json",
        {"bos_token_id": bos_id, "eos_token_id": eos_id, "do_sample": False, "max_new_tokens": 256},
    )
    write_shards(init_weights(preset, seed), out_dir, preset.num_shards)
    return out_dir
