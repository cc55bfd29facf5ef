"""A real LLaMA checkpoint whose weights make greedy decoding say one fixed answer to one fixed prompt.

Why: the tiny model `lifeline model build` makes has random weights, so it
never writes a tool call; a test of a call emitted across an engine's death
needs an engine that writes one, at a known token, every time. No engine is
told anything: the reference engine and vLLM load this directory as any
LLaMA checkpoint (same tokenizer, chat template and shapes as the base model)
and compute it with their own kernels; only the numbers in it are chosen.

How the weights say it. The answer is keyed on the absolute position, so a
token may repeat (a tag's `ool`, JSON's quotes) and a continuation sent as
`prompt ‖ committed` is predicted exactly as the first run was:

- every token's embedding is one constant unit (`_CONST`), and the chat
  template's `<|im_start|>` carries a marker unit besides;
- layer 0 has one attention head with a zero query: attention is uniform
  over the causal prefix, its value is 1 on a marker, so the head writes
  `a(p) = markers up to p / (p + 1)` into `_ALPHA`, strictly decreasing along
  the answer (no marker follows the prompt);
- layer 0's MLP cuts `a` at a threshold between every two consecutive
  answer positions (two SiLU units make a clamped step), and the difference
  of two steps is a one-hot of the position, written to its own unit;
- the output head maps position j's unit to the answer's token j; every
  other layer writes nothing.

Only the prompt it was built for (its length and its marker count) gets the
answer; any other input gets whatever these weights give, as a real model
would. `build` checks the answer with the reference engine's own model
before it returns.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.model import LlamaModel

_ALPHA, _CONST, _MARK = 0, 1, 2  # residual units; position j's one-hot is unit _FIRST_POSITION + j
_FIRST_POSITION = 3
_STEP = 20.0  # the second SiLU unit of a step sits this far below the first: clamp(g, 0, _STEP) / _STEP
_MARGIN = 80.0  # a step's gate is this many units from its threshold at the nearest answer position
_GAIN = 50.0  # one-hot magnitude after the MLP: dwarfs the constant unit, so the output head reads the position
_WEIGHT_FILE = "model-00001-of-00002.safetensors"


def build(base: Path, out: Path, prompt: list[int], answer: list[int], *, marker: int) -> Path:
    """`base`'s tokenizer and shapes, with weights that answer `prompt` with `answer` under greedy decoding.

    `marker` is the token counted by the attention head (it must be in the
    prompt and nowhere in the answer); `answer` ends with the token that
    stops the engine (EOS)."""
    config = json.loads((base / "config.json").read_text())
    hidden, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    inter, eps = config["intermediate_size"], config["rms_norm_eps"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = hidden // heads
    if marker not in prompt or marker in answer:
        raise ValueError("the marker must be in the prompt and not in the answer")
    if _FIRST_POSITION + len(answer) > hidden or 2 * (len(answer) + 1) > inter:
        raise ValueError(f"an answer of {len(answer)} tokens does not fit hidden {hidden} / intermediate {inter}")

    out.mkdir(parents=True, exist_ok=True)
    for item in base.iterdir():
        if not item.name.endswith(".safetensors") and not item.name.endswith(".index.json"):
            shutil.copy2(item, out / item.name)

    # The value a marker's position writes: its normalized marker unit (RMSNorm with eps, as the engines compute).
    marker_norm = 1.0 / ((2.0 / hidden + eps) ** 0.5)
    ids = [*prompt, *answer]
    alphas, count = [], 0
    for p, token in enumerate(ids):
        count += token == marker
        alphas.append(count / (p + 1))
    first = len(prompt) - 1  # the position whose logits give answer[0]
    # a at the positions that predict the answer, the prompt position before them and the answer's last one.
    at = [alphas[p] for p in range(first - 1, first + len(answer) + 1)]
    if any(b >= a for a, b in pairwise(at)):
        raise ValueError("the marker fraction must fall strictly along the answer")

    weights: dict[str, torch.Tensor] = {}
    embed = torch.zeros(vocab, hidden)
    embed[:, _CONST] = 1.0
    embed[marker, _MARK] = 1.0
    weights["model.embed_tokens.weight"] = embed
    for i in range(layers):
        p = f"model.layers.{i}."
        weights[p + "self_attn.q_proj.weight"] = torch.zeros(hidden, hidden)
        weights[p + "self_attn.k_proj.weight"] = torch.zeros(kv_heads * head_dim, hidden)
        weights[p + "self_attn.v_proj.weight"] = torch.zeros(kv_heads * head_dim, hidden)
        weights[p + "self_attn.o_proj.weight"] = torch.zeros(hidden, hidden)
        weights[p + "mlp.gate_proj.weight"] = torch.zeros(inter, hidden)
        weights[p + "mlp.up_proj.weight"] = torch.zeros(inter, hidden)
        weights[p + "mlp.down_proj.weight"] = torch.zeros(hidden, inter)
        weights[p + "input_layernorm.weight"] = torch.ones(hidden)
        weights[p + "post_attention_layernorm.weight"] = torch.ones(hidden)
    weights["model.norm.weight"] = torch.ones(hidden)
    layer0 = "model.layers.0."
    # Head 0 (its kv head 0): value dim 0 = 1 at a marker, written to _ALPHA.
    weights[layer0 + "self_attn.v_proj.weight"][0, _MARK] = 1.0 / marker_norm
    weights[layer0 + "self_attn.o_proj.weight"][_ALPHA, 0] = 1.0
    # After attention the residual is const 1 + a at _ALPHA: normalized, their ratio is a exactly.
    gate, up, down = (weights[layer0 + f"mlp.{n}_proj.weight"] for n in ("gate", "up", "down"))
    norm_const = 1.0 / ((1.0 + at[-1] ** 2) / hidden + eps) ** 0.5  # the const unit after the norm, ~sqrt(hidden)
    thresholds = [(a + b) / 2 for a, b in pairwise(at)]  # step k is 1 up to position first - 1 + k
    for k, threshold in enumerate(thresholds):
        slope = _MARGIN / ((at[k] - at[k + 1]) / 2 * norm_const)
        for unit, offset in ((2 * k, 0.0), (2 * k + 1, _STEP)):
            gate[unit, _ALPHA] = slope
            gate[unit, _CONST] = -slope * threshold - offset / norm_const
            up[unit, _CONST] = 1.0 / norm_const
    # Position j (predicting answer[j]) is step j+1 minus step j: steps count answer positions up to here.
    for j in range(len(answer)):
        target = _FIRST_POSITION + j
        for k, sign in ((j + 1, 1.0), (j, -1.0)):
            down[target, 2 * k] += sign * _GAIN / _STEP
            down[target, 2 * k + 1] -= sign * _GAIN / _STEP
    head = torch.zeros(vocab, hidden)
    for j, token in enumerate(answer):
        head[token, _FIRST_POSITION + j] = 1.0
    weights["lm_head.weight"] = head
    _write(out, weights)
    said = _greedy(out, prompt, len(answer))
    if said != answer:
        raise RuntimeError(f"the scripted weights answer {said}, not {answer}")
    return out


def _write(out: Path, weights: dict[str, torch.Tensor]) -> None:
    """Two shards, as the base model has (the engines read the index)."""
    names = list(weights)
    halves = {_WEIGHT_FILE: names[: len(names) // 2], "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for filename, part in halves.items():
        save_file({n: weights[n].contiguous() for n in part}, str(out / filename), metadata={"format": "pt"})
    total = sum(t.numel() * t.element_size() for t in weights.values())
    index = {"metadata": {"total_size": total}, "weight_map": {n: f for f, part in halves.items() for n in part}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _greedy(model_dir: Path, prompt: list[int], steps: int) -> list[int]:
    """The reference engine's model, float32 as vLLM runs it: the answer, token by token."""
    model = LlamaModel.load(model_dir, dtype=torch.float32)
    cache = model.new_cache(len(prompt) + steps)
    logits = model.prefill(prompt, cache)
    said: list[int] = []
    for _ in range(steps):
        said.append(int(torch.argmax(logits[-1] if logits.dim() > 1 else logits)))
        logits = model.decode([said[-1]], [cache])
    return said


# A tool-use turn, scripted: an agent's question, the tool offered, and the answer the model is built to give.
TOOLS = [{"type": "function", "function": {"name": "pool_status", "description": "a region's warm pool",
                                           "parameters": {"type": "object",
                                                          "properties": {"region": {"type": "string"}}}}}]
MESSAGES = [{"role": "user", "content": "is the standby region warm?"}]
CONTENT = "Checking the standby pool first."
CALLS = [{"name": "pool_status", "arguments": {"region": "us-east"}},
         {"name": "pool_status", "arguments": {"region": "eu-west"}}]
# As the chat template writes calls, so that the model's answer reads as its own history would.
ANSWER_TEXT = CONTENT + "".join(f"<tool_call>\n{json.dumps(call)}\n</tool_call>" for call in CALLS)


@dataclass(frozen=True)
class ToolTurn:
    model_dir: Path
    answer: list[int]  # token ids, EOS last
    content_tokens: int  # how many of them are the content before the calls
    call_tokens: int  # how many are the first call, its tags included (the second is as long)


def build_tool_turn(base: Path, out: Path) -> ToolTurn:
    """`base`'s tokenizer and template; weights that answer MESSAGES with TOOLS by CONTENT and then CALLS."""
    from tokenizers import Tokenizer

    from common.chat_template import render_chat

    tokenizer = Tokenizer.from_file(str(base / "tokenizer.json"))
    template = json.loads((base / "tokenizer_config.json").read_text())["chat_template"]
    prompt = tokenizer.encode(render_chat(template, MESSAGES, tools=TOOLS), add_special_tokens=False).ids
    content = tokenizer.encode(CONTENT, add_special_tokens=False).ids
    answer = tokenizer.encode(ANSWER_TEXT, add_special_tokens=False).ids
    if answer[:len(content)] != content:
        raise ValueError("the content's tokens must be the answer's first ones")
    eos = tokenizer.token_to_id(json.loads((base / "tokenizer_config.json").read_text())["eos_token"])
    build(base, out, prompt, [*answer, eos], marker=tokenizer.token_to_id("<|im_start|>"))
    first = tokenizer.encode(CONTENT + ANSWER_TEXT[len(CONTENT):].split("</tool_call>")[0] + "</tool_call>",
                             add_special_tokens=False).ids
    if answer[:len(first)] != first:
        raise ValueError("the first call's tokens must be the answer's next ones")
    return ToolTurn(out, [*answer, eos], len(content), len(first) - len(content))
