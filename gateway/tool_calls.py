"""Tool calls out of a chat answer's text, frame by frame: emitted once, whole, at the same frame on every replay.

The gateway renders `tools` into the prompt with the model's chat template and
speaks `/v1/completions` to engines, so the engine returns the model's raw
text; a model trained for tool use writes a call as Hermes/Qwen-style tags:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Oslo"}}
    </tool_call>

`ToolCallParser` reads the committed frames' text in order and splits it into
content (everything outside the tags) and calls. A call is emitted only once
its closing tag has arrived, as one complete `delta.tool_calls` entry (never
half a call); the frames that carried its text render an empty delta, so
every token keeps its own SSE event and `seq`. Text that may be the start of
an opening tag is held back until the next frame decides it. The split
depends on the committed text alone, never on which engine wrote it or when:
a stream that migrates continues the same text, and a client that resumes
with `Last-Event-ID` gets the rendering of the frames after it, computed by
feeding the earlier ones first (`serving.resume`). So a call is emitted once,
never twice, never half, across any number of moves.

A tag whose body is not `{"name": str, "arguments": object}` JSON is content,
as vLLM's hermes parser treats it; an answer that ends inside an unclosed tag
(`length`) gets the unclosed text back as content. A finish of `stop` after
at least one call is `tool_calls`, as OpenAI and vLLM report it. With
`max_calls` (a request's `parallel_tool_calls: false` sets 1) the calls after
that many are read and dropped, neither calls nor content, as vLLM filters
them (`maybe_filter_parallel_tool_calls`): the answer carries its first call.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
_DROPPED: dict[str, Any] = {}  # a well-formed call past `max_calls`: read, and sent as nothing


@dataclass
class ToolCallParser:
    request_id: str
    max_calls: int | None = None  # None: every call the model writes
    calls: int = 0
    _held: str = ""  # text not yet decided: a possible opening tag, or the inside of an open one
    _inside: bool = False
    emitted: list[dict[str, Any]] = field(default_factory=list)

    def feed(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """This frame's content and the calls it completes."""
        self._held += text
        content: list[str] = []
        calls: list[dict[str, Any]] = []
        while True:
            if not self._inside:
                at = self._held.find(OPEN_TAG)
                if at < 0:
                    keep = _partial_tag(self._held)
                    content.append(self._held[:len(self._held) - keep])
                    self._held = self._held[len(self._held) - keep:]
                    break
                content.append(self._held[:at])
                self._held, self._inside = self._held[at + len(OPEN_TAG):], True
            else:
                end = self._held.find(CLOSE_TAG)
                if end < 0:
                    break
                body, self._held, self._inside = self._held[:end], self._held[end + len(CLOSE_TAG):], False
                call = self._call(body)
                if call is None:
                    content.append(OPEN_TAG + body + CLOSE_TAG)
                elif call is not _DROPPED:
                    calls.append(call)
        return "".join(content), calls

    def finish(self) -> str:
        """What is still held when the answer ends: content (an unclosed tag included, as the model wrote it)."""
        rest = (OPEN_TAG if self._inside else "") + self._held
        self._held, self._inside = "", False
        return rest

    def finish_reason(self, reason: str | None) -> str | None:
        return "tool_calls" if reason == "stop" and self.calls else reason

    def _call(self, body: str) -> dict[str, Any] | None:
        try:
            decoded = json.loads(body)
        except ValueError:
            return None
        if not (isinstance(decoded, dict) and isinstance(decoded.get("name"), str) and decoded["name"]
                and isinstance(decoded.get("arguments", {}), dict)):
            return None
        if self.max_calls is not None and self.calls >= self.max_calls:
            return _DROPPED
        index = self.calls
        self.calls += 1
        call = {"index": index, "id": call_id(self.request_id, index), "type": "function",
                "function": {"name": decoded["name"], "arguments": json.dumps(decoded.get("arguments", {}))}}
        self.emitted.append(call)
        return call


def call_id(request_id: str, index: int) -> str:
    """The same id for the same call wherever and whenever it is rendered (a resumed client sees no new id)."""
    return "call_" + hashlib.sha256(f"{request_id}/{index}".encode()).hexdigest()[:24]


def _partial_tag(text: str) -> int:
    """How many trailing characters of `text` could begin an opening tag."""
    for size in range(min(len(text), len(OPEN_TAG) - 1), 0, -1):
        if OPEN_TAG.startswith(text[-size:]):
            return size
    return 0


def split_answer(request_id: str, text: str, finish_reason: str | None, *,
                 max_calls: int | None = None) -> tuple[str, list[dict[str, Any]], str | None]:
    """A whole answer's content, calls and finish (the non-streamed response)."""
    parser = ToolCallParser(request_id, max_calls)
    content, calls = parser.feed(text)
    content += parser.finish()
    return content, [{k: v for k, v in c.items() if k != "index"} for c in calls], parser.finish_reason(finish_reason)
