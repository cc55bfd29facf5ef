"""`StreamRequest`: everything needed to (re)issue one request to any engine, from any replica.

It is stored with the stream in the token log (`to_dict`), so a replica that
takes over a stream rebuilds it exactly (`from_dict`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from gateway.settings import RecoveryStrategy


@dataclass
class StreamRequest:
    request_id: str
    kind: str  # "chat" | "completion"
    model: str  # the name the client used
    version: str
    prompt_ids: list[int]
    max_tokens: int
    sampling: dict[str, Any]  # forwarded to the engine as is: temperature, top_p, seed, logit_bias, response_format, …
    stop: list[str]
    strategy: RecoveryStrategy
    deadline_wall: float  # Unix seconds (clock.wall()): another replica may read it
    created: int
    stream: bool = True
    include_usage: bool = False
    return_token_ids: bool = False
    client_key: str | None = None
    prefer_instance: str | None = None
    stateful: bool = False  # grammar / structured output: the engine's state cannot be rebuilt from the prefix
    # A sampled stream may continue on an engine that cannot redraw its tokens (contract/sampling.py) only when
    # this is true: the client gave no seed, or sent `X-Lifeline-Continuation: may-differ`. Such a continuation
    # says so in every later chunk (`lifeline.continuation: "may_differ"`).
    inexact_continuation_ok: bool = True
    # A chat request with `tools` (tool_choice not "none"): its text is split into content and tool calls when
    # rendered (gateway/tool_calls.py); the engine and the committed tokens know nothing of it.
    parse_tool_calls: bool = False
    max_tool_calls: int | None = None  # `parallel_tool_calls: false`: 1 (gateway/tool_calls.py)

    @property
    def sampled(self) -> bool:
        """Drawn at random (a temperature above 0): only position-keyed engines redraw it token for token."""
        return float(self.sampling.get("temperature") or 0.0) > 0.0

    def to_dict(self) -> dict[str, Any]:
        body = asdict(self)
        body["strategy"] = self.strategy.value
        return body

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> StreamRequest:
        # Records written before n > 1 was refused carry `resumable`; they are read as any other.
        fields = {k: v for k, v in body.items() if k not in _RETIRED_KEYS}
        return cls(**{**fields, "strategy": RecoveryStrategy(body["strategy"])})


_RETIRED_KEYS = frozenset({"resumable"})  # stored by earlier gateways; no longer means anything
