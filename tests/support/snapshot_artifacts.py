"""Small verified-artifact directories and snapshot bodies for the gateway's snapshot tests."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"


def write_version(root: Path, version: str, *, max_len: int = 256, words: tuple[str, ...] = ("a", "b", "c")) -> dict[str, str]:
    """A directory with the three files a gateway loads; returns their sha256s (VersionEntry.files)."""
    directory = root / version
    directory.mkdir(parents=True, exist_ok=True)
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    (directory / "tokenizer.json").write_text(tokenizer.to_str())
    (directory / "config.json").write_text(json.dumps({"max_position_embeddings": max_len}))
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    return {name: hashlib.sha256((directory / name).read_bytes()).hexdigest()
            for name in ("tokenizer.json", "config.json", "tokenizer_config.json")}


def snapshot_body(version: int, root: Path, files: dict[str, dict[str, str]], *, aliases: dict[str, str],
                  model: str = "tiny", region: str = "local", **extra: Any) -> dict[str, Any]:
    """A RoutingSnapshot body naming `aliases` (alias → version) of one model."""
    return {
        "schema_version": 1,
        "version": version,
        "models": {model: {
            "aliases": {name: {"version": v, "revision": 1} for name, v in aliases.items()},
            "versions": {v: {"version": v, "fingerprint": "sha256:x", "location": str(root / v), "files": files[v]}
                         for v in sorted(set(aliases.values()))},
        }},
        **extra,
    }
