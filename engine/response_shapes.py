"""Token events → OpenAI response bodies: text completions and chat completions.

`DecodeStream` is one request's path from the scheduler's token events to
text (UTF-8 safe, stop strings applied). It is a decode stream, not a
generation: "generation" in Lifeline always means the boot or lease
generation of an endpoint.
"""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer

from common.detokenize import TextAssembler
from contract.openai import completion_body, usage
from engine.protocol import CompletionRequest, EngineSampling
from engine.scheduler import Sequence, TokenEvent


class DecodeStream:
    """One request's token events as text deltas; hitting a stop string cancels the sequence."""

    def __init__(self, tokenizer: Tokenizer, seq: Sequence, stops: list[str]) -> None:
        self.seq = seq
        self.assembler = TextAssembler(tokenizer, stops)
        self.finish_reason: str | None = None

    @property
    def text(self) -> str:
        return self.assembler.text

    def accept(self, event: TokenEvent) -> str:
        """Add a token; return the text now safe to send."""
        delta, stop_hit = self.assembler.push(event.token_id, final=event.finish_reason is not None)
        self.finish_reason = event.finish_reason
        if stop_hit:
            self.finish_reason = "stop"
            self.seq.cancel()
        return delta


class CompletionShape:
    """`text_completion` bodies and chunks for one request."""

    kind = "completion"
    object_chunk = "text_completion"

    def __init__(self, tokenizer: Tokenizer, model_name: str, request_id: str, body: EngineSampling,
                 created: int) -> None:
        self.tokenizer, self.model_name, self.request_id, self.body = tokenizer, model_name, request_id, body
        self.created = created

    def chunk_choice(self, text: str, event: TokenEvent, finish: str | None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": self._logprobs([event]), "finish_reason": finish}
        if self.body.return_token_ids:
            choice["token_ids"] = [event.token_id]
        return choice

    def _logprobs(self, events: list[TokenEvent]) -> dict[str, Any] | None:
        if not (isinstance(self.body, CompletionRequest) and self.body.logprobs is not None and events):
            return None
        decode = self.tokenizer.decode
        return {
            "tokens": [decode([e.token_id]) for e in events],
            "token_logprobs": [e.logprob for e in events],
            "top_logprobs": [{decode([t]): lp for t, lp in (e.top_logprobs or {}).items()} for e in events],
            "text_offset": [],
        }

    def chunk(self, choice: dict[str, Any] | None) -> dict[str, Any]:
        return {"id": self.request_id, "object": self.object_chunk, "created": self.created,
                "model": self.model_name, "choices": [choice] if choice is not None else []}

    def opening_chunk(self) -> dict[str, Any] | None:
        return None

    def usage_chunk(self, prompt_ids: list[int], output_ids: list[int], *, cached_tokens: int) -> dict[str, Any]:
        return {**self.chunk(None), "usage": usage(len(prompt_ids), len(output_ids), cached_tokens=cached_tokens)}

    def full_body(self, text: str, events: list[TokenEvent], finish: str | None, prompt_ids: list[int], *,
                  cached_tokens: int) -> dict[str, Any]:
        token_ids = [e.token_id for e in events]
        body = completion_body(kind=self.kind, request_id=self.request_id, created=self.created, model=self.model_name,
                               text=text, finish_reason=finish,
                               token_ids=token_ids if self.body.return_token_ids else None,
                               usage_=usage(len(prompt_ids), len(token_ids), cached_tokens=cached_tokens))
        choice = body["choices"][0]
        if self.kind == "completion":
            choice["logprobs"] = self._logprobs(events)
        if self.body.return_token_ids:
            body["prompt_token_ids"] = prompt_ids
            choice["prompt_token_ids"] = prompt_ids
        return body


class ChatShape(CompletionShape):
    """`chat.completion` bodies and `chat.completion.chunk` chunks."""

    kind = "chat"
    object_chunk = "chat.completion.chunk"

    def chunk_choice(self, text: str, event: TokenEvent, finish: str | None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}
        if self.body.return_token_ids:
            choice["token_ids"] = [event.token_id]
        return choice

    def opening_chunk(self) -> dict[str, Any] | None:
        return self.chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                           "finish_reason": None})
