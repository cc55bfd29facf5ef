"""The semantic fingerprint: what a client's tokens and prompts depend on.

A standby may serve a primary's traffic only if it speaks the same
tokenizer (and its configuration), chat template, generation defaults and
architecture. The fingerprint hashes those five parts as canonical JSON (sorted keys, no
insignificant whitespace), so re-serialising a file with another key order
or indentation does not change it, while any value change does.

Parts and where they come from:

- tokenizer: `tokenizer.json`
- tokenizer_config: `tokenizer_config.json` without `chat_template` (its
  own part) and tooling keys: BOS/EOS/PAD/UNK tokens, `add_bos_token`,
  `add_eos_token`, `added_tokens_decoder`, special tokens, cleanup and
  prefix-space flags all change the token ids a prompt becomes. A deny
  list, not an allow list, so a field nobody thought of still counts.
- chat_template: `chat_template` in `tokenizer_config.json`, or the file
  `chat_template.jinja` (the newer layout); hashed as text
- generation_config: `generation_config.json`
- architecture: `config.json` without `transformers_version` and
  `_name_or_path`, which record tooling and a local path, not the model
  (`torch_dtype` is kept: it changes numerics)

A missing part hashes as `null`, so two versions that both lack a chat
template still match, and one that gains one does not.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from weight_catalog.errors import InvalidArtifact

FINGERPRINT_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json", "config.json")
TOOLING_KEYS = ("transformers_version", "_name_or_path")
TOKENIZER_CONFIG_TOOLING_KEYS = (*TOOLING_KEYS, "name_or_path", "tokenizer_file", "_commit_hash", "chat_template")

ReadText = Callable[[str], str | None]


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _load_json(name: str, text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidArtifact(f"{name} is not valid JSON: {exc}") from exc


def fingerprint_parts(read_text: ReadText) -> dict[str, str]:
    """Digest of each semantic part; `read_text(name)` returns None for a missing file."""
    tokenizer = _load_json("tokenizer.json", read_text("tokenizer.json"))
    tokenizer_config = _load_json("tokenizer_config.json", read_text("tokenizer_config.json"))
    behaviour: Any = None
    if isinstance(tokenizer_config, dict):
        behaviour = {k: v for k, v in tokenizer_config.items() if k not in TOKENIZER_CONFIG_TOOLING_KEYS}
    template: Any = None
    if isinstance(tokenizer_config, dict) and tokenizer_config.get("chat_template") is not None:
        template = tokenizer_config["chat_template"]
    else:
        template = read_text("chat_template.jinja")
    generation = _load_json("generation_config.json", read_text("generation_config.json"))
    architecture = _load_json("config.json", read_text("config.json"))
    if isinstance(architecture, dict):
        architecture = {k: v for k, v in architecture.items() if k not in TOOLING_KEYS}
    if isinstance(generation, dict):
        generation = {k: v for k, v in generation.items() if k not in TOOLING_KEYS}
    return {
        "tokenizer": _sha(canonical_json(tokenizer)),
        "tokenizer_config": _sha(canonical_json(behaviour)),
        "chat_template": _sha(canonical_json(template)),
        "generation_config": _sha(canonical_json(generation)),
        "architecture": _sha(canonical_json(architecture)),
    }


def fingerprint(parts: dict[str, str]) -> str:
    return _sha(canonical_json(parts))
