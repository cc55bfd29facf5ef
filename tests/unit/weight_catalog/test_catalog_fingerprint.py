from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.controlplane_testing import write_artifact
from weight_catalog.errors import InvalidArtifact
from weight_catalog.fingerprint import fingerprint, fingerprint_parts
from weight_catalog.store import FilesystemStore


def parts_of(root: Path) -> dict[str, str]:
    return fingerprint_parts(FilesystemStore(root).read_text)


def test_cosmetic_key_order_and_whitespace_do_not_change_the_fingerprint(tmp_path: Path) -> None:
    a = parts_of(write_artifact(tmp_path / "a", indent=2))
    b = parts_of(write_artifact(tmp_path / "b", indent=None, key_order_reversed=True))
    assert a == b
    assert fingerprint(a) == fingerprint(b)


def test_tooling_keys_do_not_change_the_fingerprint(tmp_path: Path) -> None:
    root = write_artifact(tmp_path / "a")
    before = parts_of(root)
    config = json.loads((root / "config.json").read_text())
    config["transformers_version"] = "9.9.9"
    config["_name_or_path"] = "/somewhere/else"
    (root / "config.json").write_text(json.dumps(config))
    assert parts_of(root) == before


@pytest.mark.parametrize(
    ("change", "part"),
    [
        ({"vocab": {"a": 0, "b": 1, "ba": 2}}, "tokenizer"),
        ({"chat_template": "{{ messages }}"}, "chat_template"),
        ({"generation_config": {"do_sample": True}}, "generation_config"),
        ({"hidden_size": 128}, "architecture"),
    ],
)
def test_each_semantic_part_changes_only_its_digest(tmp_path: Path, change: dict, part: str) -> None:
    base = parts_of(write_artifact(tmp_path / "base"))
    other = parts_of(write_artifact(tmp_path / "other", **change))
    assert {k for k in base if base[k] != other[k]} == {part}
    assert fingerprint(base) != fingerprint(other)


def test_chat_template_file_counts_when_tokenizer_config_has_none(tmp_path: Path) -> None:
    root = write_artifact(tmp_path / "a")
    (root / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    without = parts_of(root)
    (root / "chat_template.jinja").write_text("{{ x }}")
    assert parts_of(root)["chat_template"] != without["chat_template"]


def test_invalid_json_is_a_typed_error(tmp_path: Path) -> None:
    root = write_artifact(tmp_path / "a")
    (root / "config.json").write_text("{not json")
    with pytest.raises(InvalidArtifact, match="config.json"):
        parts_of(root)


@pytest.mark.parametrize(
    "change",
    [
        {"eos_token": "<|end|>"},
        {"bos_token": "<s>"},
        {"add_bos_token": True},
        {"additional_special_tokens": ["<tool>"]},
        {"added_tokens_decoder": {"7": {"content": "<x>", "special": True}}},
    ],
)
def test_behaviour_changing_tokenizer_config_fields_change_the_tokenizer_config_part(tmp_path: Path,
                                                                                    change: dict) -> None:
    root = write_artifact(tmp_path / "a")
    before = parts_of(root)
    config = json.loads((root / "tokenizer_config.json").read_text())
    (root / "tokenizer_config.json").write_text(json.dumps({**config, **change}))
    after = parts_of(root)
    assert {k for k in before if before[k] != after[k]} == {"tokenizer_config"}


def test_tooling_keys_of_tokenizer_config_do_not_change_the_fingerprint(tmp_path: Path) -> None:
    root = write_artifact(tmp_path / "a")
    before = parts_of(root)
    config = json.loads((root / "tokenizer_config.json").read_text())
    config.update(name_or_path="/elsewhere", tokenizer_file="/x/tokenizer.json", transformers_version="9")
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    assert parts_of(root) == before
