"""The drill's synthetic traffic: streams through the gateway with the official `openai` client, as a customer's.

Moved out of controlplane/drill/runner.py unchanged; the runner owns one
`DrillTraffic` and sends every request through it: the undisturbed runs each
drill request is compared with (`baseline`, `conversation_baseline`), the
drill's own requests (`stream`) and the fault plan's probe (`probe`).
Where the fleet resolves its gateway (`Fleet.resolve_gateway`: a region
drill's DNS name), every attempt asks it again; with `traffic.retry_for_s` a
broken request is sent again from scratch, as a client would after its
connection broke.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from common.clock import Clock
from controlplane.drill.measure import RequestTrace
from controlplane.drill.schemas import Traffic

if TYPE_CHECKING:
    from controlplane.drill.runner import Fleet

# The session headers of contract/session.py (SESSION_HEADER, SESSION_CLASS_HEADER); spelled here so a drill
# still runs against a gateway built before sessions (which ignores them, and then RPO_context stays unmeasured).
# RPO_context is read from each turn's `lifeline.session` (measure.rpo_context), not from the gateways'
# histogram: that one sums every turn's re-prefilled partial block, fault or not.
SESSION_HEADER = "x-session-id"
SESSION_CLASS_HEADER = "x-session-class"


@dataclass
class LiveTraffic:
    """What the requests in flight share with the runner: their traces, the tokens seen so far, the stop."""

    traces: list[RequestTrace] = field(default_factory=list)
    tokens_seen: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)


class DrillTraffic:
    def __init__(self, *, fleet: Fleet, clock: Clock, sleep: Callable[[float], None]) -> None:
        self.fleet = fleet
        self.clock = clock
        self.sleep = sleep

    def _client(self, gateway_url: str) -> Any:
        import openai  # the official client: the drill speaks to the gateway as any customer does

        return openai.OpenAI(base_url=gateway_url.rstrip("/") + "/v1", api_key="drill",
                             max_retries=0, timeout=120.0)

    @staticmethod
    def _body(traffic: Traffic, mode: str) -> dict[str, Any]:
        body: dict[str, Any] = {"max_tokens": traffic.max_tokens, "temperature": 0.0}
        extra: dict[str, Any] = {"ignore_eos": True, "return_token_ids": True}
        if mode == "seeded":
            body.update(temperature=1.0, top_p=0.95, seed=traffic.seed)
        return {**body, "extra_body": extra}

    def baseline(self, model_name: str, traffic: Traffic, mode: str) -> RequestTrace:
        """The undisturbed run every drill request is compared with, token by token."""
        trace = RequestTrace(index=-1, sampling=mode, started_at=self.clock.now())
        self.stream(model_name, traffic, mode, trace, LiveTraffic(), prefer=None)
        if trace.error:
            raise RuntimeError(f"the undisturbed {mode} run failed: {trace.error}")
        return trace

    def conversation_baseline(self, model_name: str, traffic: Traffic, mode: str) -> list[RequestTrace]:
        """The undisturbed conversation (no session header: nothing checkpointed, nothing counted)."""
        turns: list[RequestTrace] = []
        for turn in range(traffic.session_turns):
            trace = RequestTrace(index=-1, sampling=mode, started_at=self.clock.now(), turn=turn)
            self.stream(model_name, traffic, mode, trace, LiveTraffic(), prefer=None,
                        messages=chat_messages(traffic, [t.text for t in turns]))
            if trace.error:
                raise RuntimeError(f"the undisturbed {mode} conversation failed at turn {turn}: {trace.error}")
            turns.append(trace)
        return turns

    def _gateway(self) -> str:
        """Where the next attempt goes: the fleet's resolver when it has one (a DNS name), else its gateway."""
        resolve = getattr(self.fleet, "resolve_gateway", None)
        return resolve() if resolve is not None else self.fleet.gateway_url

    def stream(self, model_name: str, traffic: Traffic, mode: str, trace: RequestTrace, live: LiveTraffic,
               prefer: str | None, session: str | None = None,
               messages: list[dict[str, str]] | None = None) -> None:
        """One request, start to end; with `traffic.retry_for_s`, failed attempts are sent again from scratch.

        A retry is what a client does after its connection broke: it re-resolves (`_gateway`) and asks
        again. Every token any attempt delivered keeps its arrival time (the gap at the client spans the
        attempts); the ids are the last attempt's, and the tokens an abandoned attempt had delivered are
        counted as delivered twice (`discarded_tokens`).
        """
        deadline = trace.started_at + traffic.retry_for_s
        try:
            while True:
                error = self._attempt(model_name, traffic, mode, trace, live, prefer, session, messages)
                if error is None or live.stop.is_set() or self.clock.now() + traffic.retry_backoff_s > deadline:
                    trace.error = error
                    return
                trace.discarded_tokens += len(trace.token_ids)
                trace.token_ids, trace.seqs, trace.text, trace.session = [], [], "", None
                trace.epochs += [trace.epochs[-1] if trace.epochs else 0] * (len(trace.token_times)
                                                                              - len(trace.epochs))
                trace.attempts += 1
                self.sleep(traffic.retry_backoff_s)
        finally:
            trace.ended_at = self.clock.now()

    def _attempt(self, model_name: str, traffic: Traffic, mode: str, trace: RequestTrace, live: LiveTraffic,
                 prefer: str | None, session: str | None,
                 messages: list[dict[str, str]] | None = None) -> str | None:
        """One attempt of a request (a chat turn when `messages`); None if it delivered every token, else why not."""
        headers = {"X-Lifeline-Prefer-Instance": prefer} if prefer else {}
        if session is not None:
            headers[SESSION_HEADER] = session
            if trace.session_class:
                headers[SESSION_CLASS_HEADER] = trace.session_class
        retried = trace.attempts - 1
        got = 0
        try:
            gateway = self._gateway()
            trace.gateways.append(gateway)
            client = self._client(gateway)
            if messages is None:
                stream = client.completions.create(model=model_name, prompt=traffic.prompt, stream=True,
                                                   extra_headers=headers, **self._body(traffic, mode))
            else:  # the usage chunk carries the turn's `lifeline.session` (what the engine restored)
                stream = client.chat.completions.create(model=model_name, messages=messages, stream=True,
                                                        stream_options={"include_usage": True},
                                                        extra_headers=headers, **self._body(traffic, mode))
            for chunk in stream:
                now = self.clock.now()
                lifeline = (chunk.model_extra or {}).get("lifeline") or {}
                if "session" in lifeline:
                    trace.session = dict(lifeline["session"])
                for choice in chunk.choices:
                    delta = getattr(choice, "delta", None)
                    trace.text += (getattr(delta, "content", None) or "") if delta is not None else ""
                    ids = (choice.model_extra or {}).get("token_ids") or []
                    for token_id in ids:
                        trace.token_times.append(now)
                        trace.token_ids.append(int(token_id))
                    got += len(ids)
                    if ids:
                        with live.lock:
                            live.tokens_seen += len(ids)
                        if "seq" in lifeline:
                            trace.seqs.append(int(lifeline["seq"]))
                        if "epoch" in lifeline or retried:
                            # A retried attempt is another stream: its tokens count as moved (epoch ≥ 1).
                            trace.epochs.append(int(lifeline.get("epoch", 0)) + retried)
            if got < traffic.max_tokens:
                return f"stream ended after {got} of {traffic.max_tokens} tokens"
            return None
        except Exception as error:  # noqa: BLE001 - openai.APIError, transport errors alike: the request is lost
            # The stable error type the gateway sent (openai.APIError.type), so a documented refusal is told apart.
            kind = getattr(error, "type", None)
            return f"{type(error).__name__}: {f'[{kind}] ' if kind else ''}{error}"[:500]

    def probe(self, model_name: str, traffic: Traffic) -> str | None:
        """One new stream through the gateway: None if it was served in full, else its error."""
        trace = RequestTrace(index=-2, sampling="greedy", started_at=self.clock.now())
        self.stream(model_name, traffic, "greedy", trace, LiveTraffic(), prefer=None)
        return trace.error


def chat_messages(traffic: Traffic, answers: list[str]) -> list[dict[str, str]]:
    """The messages of the turn after `answers`: the prompt, then each answer and the next follow-up."""
    messages = [{"role": "user", "content": traffic.prompt}]
    for i, answer in enumerate(answers):
        messages += [{"role": "assistant", "content": answer},
                     {"role": "user", "content": traffic.follow_ups[i % len(traffic.follow_ups)]}]
    return messages
