"""Small engine pieces: boot generation, detokenizer, stop strings."""

from __future__ import annotations

import random
from multiprocessing import Pool
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from engine.boot_generation import next_boot_generation
from common.detokenize import IncrementalDetokenizer, stop_holdback


def test_boot_generation_grows_on_every_start(tmp_path: Path) -> None:
    assert [next_boot_generation(tmp_path) for _ in range(3)] == [1, 2, 3]


def test_boot_generation_is_unique_across_concurrent_starts(tmp_path: Path) -> None:
    with Pool(4) as pool:
        generations = pool.map(next_boot_generation, [tmp_path] * 20)
    assert sorted(generations) == list(range(1, 21))


def test_corrupt_generation_file_stops_start_up(tmp_path: Path) -> None:
    (tmp_path / "generation").write_text("not a number")
    with pytest.raises(RuntimeError, match="corrupt generation file"):
        next_boot_generation(tmp_path)


def test_incremental_detokenizer_never_emits_half_a_character(tiny_model: Path) -> None:
    tokenizer = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    text = "Grüße 故障恢复 🚀 ⚠️ done"
    ids = tokenizer.encode(text).ids
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.push(i) for i in ids]
    assert "".join(pieces) == text
    assert not any("\ufffd" in piece for piece in pieces)
    assert len(ids) > len(text.split())  # the emoji and CJK really were split across tokens


def test_incremental_detokenizer_matches_full_decode_on_random_ids(tiny_model: Path) -> None:
    tokenizer = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    rng = random.Random(5)
    for _ in range(100):
        ids = [rng.randrange(tokenizer.get_vocab_size()) for _ in range(40)]
        detok = IncrementalDetokenizer(tokenizer)
        assert "".join(detok.push(i) for i in ids) + detok.flush() == tokenizer.decode(ids)


@pytest.mark.parametrize(
    ("text", "stops", "held"),
    [("hello wor", ["world"], 3), ("hello", ["xyz"], 0), ("abc<|", ["<|end|>", "c<"], 2), ("", ["a"], 0)],
)
def test_stop_holdback_keeps_possible_stop_prefixes(text: str, stops: list[str], held: int) -> None:
    assert stop_holdback(text, stops) == held
