"""`lifeline model build`: deterministic, sharded, a real LLaMA checkpoint."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from engine.model import LlamaModel, load_weights
from engine.model_build import build_model


def _digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_same_preset_and_seed_give_byte_identical_files(tmp_path: Path, tiny_model: Path) -> None:
    rebuilt = build_model(tmp_path / "again", preset_name="tiny", seed=0)
    assert _digests(rebuilt) == _digests(tiny_model)


def test_other_seed_changes_weights_but_not_tokenizer(tmp_path: Path, tiny_model: Path) -> None:
    other = _digests(build_model(tmp_path / "seed1", preset_name="tiny", seed=1))
    base = _digests(tiny_model)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json"):
        assert other[name] == base[name], name
    shards = [n for n in base if n.endswith(".safetensors")]
    assert len(shards) >= 2
    assert all(other[n] != base[n] for n in shards)


def test_tiny_model_is_a_five_million_parameter_llama_with_chat_template(tiny_model: Path) -> None:
    config = json.loads((tiny_model / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    params = sum(t.numel() for t in load_weights(tiny_model).values())
    assert 4_000_000 <= params <= 6_000_000
    template = json.loads((tiny_model / "tokenizer_config.json").read_text())["chat_template"]
    assert "<|im_start|>" in template


def test_unknown_preset_and_negative_seed_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown preset"):
        build_model(tmp_path / "x", preset_name="huge", seed=0)
    with pytest.raises(ValueError, match="seed"):
        build_model(tmp_path / "y", preset_name="tiny", seed=-1)


def test_forward_pass_matches_transformers_llama(tiny_model: Path) -> None:
    from transformers import LlamaForCausalLM

    ids = [5, 100, 2000, 37, 999, 3, 4000, 12, 77, 1234]
    ours_model = LlamaModel.load(tiny_model, torch.float64)
    cache = ours_model.new_cache(len(ids))
    ours = [ours_model.prefill(ids[:4], cache)]
    ours += [ours_model.decode([token], [cache])[0] for token in ids[4:-1]]
    reference = LlamaForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float64)
    with torch.no_grad():
        expected = reference(torch.tensor([ids])).logits[0, 3:-1]
    # transformers computes RoPE frequencies in float32, hence not 1e-12.
    torch.testing.assert_close(torch.stack(ours), expected, atol=1e-4, rtol=1e-5)
    assert torch.equal(torch.stack(ours).argmax(-1), expected.argmax(-1))


def test_batched_decode_equals_one_sequence_at_a_time(tiny_model: Path) -> None:
    model = LlamaModel.load(tiny_model, torch.float64)
    prompts = [[1, 2, 3], [40, 41, 42, 43, 44, 45], [7]]
    batched = [model.new_cache(16) for _ in prompts]
    alone = [model.new_cache(16) for _ in prompts]
    for prompt, c1, c2 in zip(prompts, batched, alone, strict=True):
        model.prefill(prompt, c1)
        model.prefill(prompt, c2)
    step = model.decode([10, 20, 30], batched)
    for row, token, cache in zip(step, [10, 20, 30], alone, strict=True):
        torch.testing.assert_close(row, model.decode([token], [cache])[0], atol=1e-12, rtol=0)


def test_prefill_of_prefix_equals_step_by_step_decode(tiny_model: Path) -> None:
    """The property token-commit-resume stands on: prompt‖prefix prefilled at once
    leads to the same next-token argmax as decoding the prefix one token at a time."""
    model = LlamaModel.load(tiny_model, torch.float64)
    prompt = [11, 22, 33, 44]
    cache = model.new_cache(64)
    logits = model.prefill(prompt, cache)
    generated = []
    for _ in range(40):
        token = int(logits.argmax())
        generated.append(token)
        logits = model.decode([token], [cache])[0]
    for k in (1, 17, 39):
        resumed = model.prefill(prompt + generated[:k], model.new_cache(64))
        assert int(resumed.argmax()) == generated[k]


def test_preset_sizes_match_the_built_weights_and_the_promise(tiny_model: Path) -> None:
    from engine.presets import get_preset

    assert get_preset("tiny").parameter_count == sum(t.numel() for t in load_weights(tiny_model).values())
    assert 90_000_000 <= get_preset("small").parameter_count <= 120_000_000


def test_model_build_cli_refuses_bad_arguments_and_writes_nothing(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from lifeline.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["model", "build", str(tmp_path / "m"), "--preset", "gigantic"])
    assert result.exit_code == 2 and "gigantic" not in str(tmp_path)
    assert not (tmp_path / "m").exists()
    result = runner.invoke(app, ["model", "build", str(tmp_path / "m"), "--seed", "-4"])
    assert result.exit_code == 2
    assert not (tmp_path / "m").exists()
