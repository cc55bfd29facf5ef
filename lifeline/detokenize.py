"""Incremental, UTF-8-safe detokenization.

Byte-level BPE tokens can end in the middle of a multi-byte character.
Decoding token by token would emit U+FFFD for each half; instead we decode
a short window of recent tokens and only release text once it no longer
ends in an incomplete character. Shared by the engine and the gateway.
"""

from __future__ import annotations

from tokenizers import Tokenizer

_REPLACEMENT = "\ufffd"
# How many earlier tokens to re-decode for context; a UTF-8 character spans at most 4 bytes.
_WINDOW = 6


class IncrementalDetokenizer:
    """Feed token ids one at a time; get back the text they complete, possibly ''."""

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._emitted_upto = 0  # index into _ids: tokens whose text has been released
        self._prefix_offset = 0  # window start for context

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        prefix = self._decode(self._ids[self._prefix_offset : self._emitted_upto])
        full = self._decode(self._ids[self._prefix_offset :])
        if full.endswith(_REPLACEMENT) or len(full) < len(prefix):
            return ""  # wait for the rest of the character
        new_text = full[len(prefix) :]
        self._emitted_upto = len(self._ids)
        self._prefix_offset = max(0, self._emitted_upto - _WINDOW)
        return new_text

    def flush(self) -> str:
        """Text still held back at the end of a stream (an incomplete trailing character)."""
        prefix = self._decode(self._ids[self._prefix_offset : self._emitted_upto])
        full = self._decode(self._ids[self._prefix_offset :])
        self._emitted_upto = len(self._ids)
        return full[len(prefix) :]
