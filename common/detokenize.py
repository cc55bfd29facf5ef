"""Incremental, UTF-8-safe detokenization.

Byte-level BPE tokens can end in the middle of a multi-byte character.
Decoding token by token would emit U+FFFD for each half; instead we decode
a short window of recent tokens and only release text once it no longer
ends in an incomplete character. Shared by the engine and the gateway.
"""

from __future__ import annotations

from tokenizers import Tokenizer

_REPLACEMENT = "\ufffd"
# Earlier tokens re-decoded for context (a UTF-8 character spans at most 4 bytes);
# the window slides only once it holds twice that, so most tokens cost one decode.
_WINDOW = 6


class IncrementalDetokenizer:
    """Feed token ids one at a time; get back the text they complete, possibly ''."""

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._emitted_upto = 0  # index into _ids: tokens whose text has been released
        self._prefix_offset = 0  # window start for context
        self._prefix_text = ""  # decode of _ids[_prefix_offset:_emitted_upto]

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        full = self._decode(self._ids[self._prefix_offset :])
        if full.endswith(_REPLACEMENT) or len(full) < len(self._prefix_text):
            return ""  # wait for the rest of the character
        new_text = full[len(self._prefix_text) :]
        self._emitted_upto = len(self._ids)
        if self._emitted_upto - self._prefix_offset > 2 * _WINDOW:
            self._prefix_offset = self._emitted_upto - _WINDOW
            self._prefix_text = self._decode(self._ids[self._prefix_offset : self._emitted_upto])
        else:
            self._prefix_text = full
        return new_text

    def flush(self) -> str:
        """Text still held back at the end of a stream (an incomplete trailing character)."""
        full = self._decode(self._ids[self._prefix_offset :])
        self._emitted_upto = len(self._ids)
        tail, self._prefix_text = full[len(self._prefix_text) :], full
        return tail


def stop_holdback(text: str, stops: list[str]) -> int:
    """How many trailing characters of `text` might still grow into a stop string."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:size]):
                longest = max(longest, size)
                break
    return longest


class TextAssembler:
    """Token ids → text deltas, UTF-8 safe, with stop strings applied.

    Text that could still turn out to be the start of a stop string is held
    back until it can't; a stop string itself is never emitted.
    """

    def __init__(self, tokenizer: Tokenizer, stops: list[str]) -> None:
        self.detok = IncrementalDetokenizer(tokenizer)
        self.stops = stops
        self.text = ""  # everything decoded so far, cut at a stop string once one is hit
        self.sent = 0  # characters of `text` already handed out

    def push(self, token_id: int, *, final: bool) -> tuple[str, bool]:
        """Add a token; return (text now safe to send, whether a stop string was hit)."""
        self.text += self.detok.push(token_id)
        if final:
            self.text += self.detok.flush()
        stop_hit = False
        for stop in self.stops:
            at = self.text.find(stop, max(0, self.sent - len(stop)))
            if at != -1:
                self.text, stop_hit = self.text[:at], True
        holdback = 0 if (final or stop_hit) else stop_holdback(self.text, self.stops)
        upto = max(self.sent, len(self.text) - holdback)
        delta, self.sent = self.text[self.sent : upto], upto
        return delta, stop_hit
