"""How engine responses map to failures: the real HTTP parser fed canned bytes over an in-memory transport."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.engine_client import EngineClient, EngineFailure, EngineRejected, EngineToken, Opened
from gateway.router import Endpoint

ENDPOINT = Endpoint("eng-a", 3, "http://eng-a:8000", "v", "z")
SSE = {"content-type": "text/event-stream"}


def _sse(*token_ids: int, finish_last: bool = True) -> bytes:
    lines = []
    for i, t in enumerate(token_ids):
        finish = "length" if finish_last and i == len(token_ids) - 1 else None
        lines.append("data: " + json.dumps({"choices": [{"token_ids": [t], "text": "x", "finish_reason": finish}]}) + "\n\n")
    return "".join(lines).encode()


def _http(status: int, body: bytes = b"", headers: dict[str, str] | None = None, *, complete: bool = True) -> bytes:
    """A chunked HTTP/1.1 response; `complete=False` leaves out the last chunk (the engine died mid-body)."""
    head = f"HTTP/1.1 {status} X\r\n" + "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head += "transfer-encoding: chunked\r\n\r\n"
    parts = [part + b"\n\n" for part in body.split(b"\n\n")[:-1]] if body.endswith(b"\n\n") else [body] if body else []
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts)  # one chunk per event, as engines flush
    return head.encode() + chunks + (b"0\r\n\r\n" if complete else b"")


def _json(status: int, payload: dict) -> bytes:
    return _http(status, json.dumps(payload).encode(), {"content-type": "application/json"})


class FakeEngine:
    """Answers every request with canned bytes, fed a few bytes at a time to exercise reassembly."""

    def __init__(self, response: bytes | Exception, *, hang_up: bool = False, piece: int = 7, close_idle: bool = False) -> None:
        self.response = response
        self.hang_up = hang_up
        self.close_idle = close_idle  # hang up, unanswered, on a second request over a kept-alive connection
        self.piece = piece
        self.requests: list[bytes] = []
        self.connects = 0
        self.transports: list[FakeTransport] = []

    async def connect(self, factory, host: str, port: int, tls: bool):
        if isinstance(self.response, Exception):
            raise self.response
        self.connects += 1
        protocol = factory()
        transport = FakeTransport(self, protocol)
        self.transports.append(transport)
        protocol.connection_made(transport)
        return transport, protocol


class FakeTransport(asyncio.Transport):
    def __init__(self, engine: FakeEngine, protocol: asyncio.Protocol) -> None:
        super().__init__()
        self.engine, self.protocol, self.closed, self.served = engine, protocol, False, 0

    def write(self, data: bytes) -> None:
        self.engine.requests.append(data)
        self.served += 1
        loop = asyncio.get_running_loop()
        if self.engine.close_idle and self.served > 1:
            loop.call_soon(self.close)
            return
        raw = self.engine.response
        for i in range(0, len(raw), self.engine.piece):
            loop.call_soon(self._deliver, raw[i : i + self.engine.piece])
        if self.engine.hang_up:
            loop.call_soon(self.close)

    def _deliver(self, data: bytes) -> None:
        if not self.closed:
            self.protocol.data_received(data)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _client(engine: FakeEngine) -> EngineClient:
    return EngineClient(connect_timeout=1.0, connector=engine.connect)


async def _collect(client: EngineClient, *, stall_timeout: float = 1.0) -> list:
    return [item async for item in client.stream(ENDPOINT, {"prompt": [1]}, first_token_timeout=1, stall_timeout=stall_timeout, attempt_id="cmpl-test.0")]


async def test_tokens_of_the_routed_generation_pass():
    engine = FakeEngine(_http(200, _sse(5, 6, 7) + b"data: [DONE]\n\n", {**SSE, "x-lifeline-generation": "3"}))
    items = await _collect(_client(engine))
    assert items == [Opened(3), EngineToken(5, None), EngineToken(6, None), EngineToken(7, "length")]
    assert engine.requests[0].startswith(b"POST /v1/completions HTTP/1.1\r\nHost: eng-a:8000\r\n")
    assert engine.requests[0].endswith(b'\r\n\r\n{"prompt":[1]}')
    assert b"\r\nX-Request-Id: cmpl-test.0\r\n" in engine.requests[0]  # the engine logs the gateway's id


async def test_a_completed_stream_reuses_its_connection():
    engine = FakeEngine(_http(200, _sse(5) + b"data: [DONE]\n\n", {**SSE, "x-lifeline-generation": "3"}))
    client = _client(engine)
    for _ in range(3):
        stream = client.stream(ENDPOINT, {}, first_token_timeout=1, stall_timeout=1, attempt_id="cmpl-test.0")
        items = [item async for item in stream]
        assert items[-1] == EngineToken(5, "length")
        for _ in range(20):  # the end of the response lands just behind the last token
            await asyncio.sleep(0)
    assert engine.connects == 1
    assert len(engine.requests) == 3


async def test_a_stream_abandoned_mid_way_closes_its_connection():
    engine = FakeEngine(_http(200, _sse(5, 6, 7, 8, finish_last=False), {**SSE, "x-lifeline-generation": "3"}, complete=False))
    stream = _client(engine).stream(ENDPOINT, {}, first_token_timeout=1, stall_timeout=1, attempt_id="cmpl-test.0")
    assert await anext(stream) == Opened(3)
    assert await anext(stream) == EngineToken(5, None)
    await stream.aclose()
    assert engine.transports[0].closed  # the engine sees the hang-up and stops decoding


async def test_frames_from_another_generation_are_dropped():
    engine = FakeEngine(_http(200, _sse(5, 6), {**SSE, "x-lifeline-generation": "4"}))
    with pytest.raises(EngineFailure) as failure:
        await _collect(_client(engine))
    assert failure.value.reason == "stale_generation"


@pytest.mark.parametrize(("response", "reason"), [
    (_json(500, {"error": {"message": "boom"}}), "http_500"),
    (_json(503, {}), "http_503"),
    (_http(200, _sse(5, 6, finish_last=False), SSE), "stream_ended"),
    (_http(200, b"data: [DONE]\n\n", SSE), "stream_ended"),
    (_http(200, b'data: {"error": {"message": "oom"}}\n\n', SSE), "engine_error"),
    (_json(200, {"choices": []}), "bad_response"),
    (_http(200, b"data: not json\n\n", SSE), "bad_response"),
    (_http(200, b'data: {"choices": []}\n\n', SSE), "bad_response"),
    (b"HTTP/1.1 200 OK\r\nbroken header line\r\n\r\n", "connection_lost"),
])
async def test_engine_failures_are_classified(response, reason):
    with pytest.raises(EngineFailure) as failure:
        await _collect(_client(FakeEngine(response)))
    assert failure.value.reason == reason


async def test_an_engine_that_dies_mid_body_is_a_lost_connection():
    engine = FakeEngine(_http(200, _sse(5, 6, finish_last=False), SSE, complete=False), hang_up=True)
    stream = _client(engine).stream(ENDPOINT, {}, first_token_timeout=1, stall_timeout=1, attempt_id="cmpl-test.0")
    items = []
    with pytest.raises(EngineFailure) as failure:
        async for item in stream:
            items.append(item)
    assert failure.value.reason == "connection_lost"
    assert items == [Opened(None), EngineToken(5, None), EngineToken(6, None)]


async def test_a_silent_engine_is_a_stall():
    engine = FakeEngine(_http(200, _sse(5, finish_last=False), SSE, complete=False))
    with pytest.raises(EngineFailure) as failure:
        await _collect(_client(engine), stall_timeout=0.05)
    assert failure.value.reason == "stall"


async def test_sse_events_with_crlf_and_several_data_lines_are_read():
    body = b'data: {"choices":\r\ndata: [{"token_ids": [9], "finish_reason": "stop"}]}\r\n\r\n'
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n" % len(body)
    items = await _collect(_client(FakeEngine(head + body)))
    assert items == [Opened(None), EngineToken(9, "stop")]


async def test_client_errors_are_not_migrated():
    engine = FakeEngine(_json(400, {"error": {"message": "too long", "type": "BadRequestError"}}))
    with pytest.raises(EngineRejected) as rejected:
        await _collect(_client(engine))
    assert rejected.value.status_code == 400
    assert rejected.value.body["error"]["message"] == "too long"


async def test_connect_refused_is_a_failure():
    with pytest.raises(EngineFailure) as failure:
        await _collect(_client(FakeEngine(ConnectionRefusedError(111, "refused"))))
    assert failure.value.reason == "connect"


async def _two_requests(engine: FakeEngine, client: EngineClient) -> None:
    for _ in range(2):
        items = [item async for item in client.stream(ENDPOINT, {}, first_token_timeout=1, stall_timeout=1, attempt_id="cmpl-test.0")]
        assert items[-1] == EngineToken(5, "length")
        for _ in range(20):
            await asyncio.sleep(0)


async def test_a_kept_alive_connection_the_engine_closed_is_retried_once_on_a_new_one():
    engine = FakeEngine(_http(200, _sse(5) + b"data: [DONE]\n\n", SSE), close_idle=True)
    await _two_requests(engine, _client(engine))
    assert engine.connects == 2 and len(engine.requests) == 3  # the unanswered one was sent again


async def test_connections_idle_past_the_expiry_are_not_reused():
    engine = FakeEngine(_http(200, _sse(5) + b"data: [DONE]\n\n", SSE))
    client = _client(engine)
    client.idle_expiry = -1.0  # every idle connection counts as expired
    await _two_requests(engine, client)
    assert engine.connects == 2 and engine.transports[0].closed


async def test_an_engine_draining_error_event_is_a_planned_shutdown_not_an_engine_error():
    from contract.identity import DRAINING_ERROR_TYPE
    from gateway.engine_client import DRAINING

    error = {"error": {"message": "planned shutdown", "type": DRAINING_ERROR_TYPE, "param": None, "code": 503}}
    body = _sse(7, finish_last=False) + b"event: error\ndata: " + json.dumps(error).encode() + b"\n\n"
    with pytest.raises(EngineFailure) as failed:
        await _collect(_client(FakeEngine(_http(200, body, SSE))))
    assert failed.value.reason == DRAINING


def _chunk(token_ids: list[int] | None, finish: str | None, text: str = "x") -> bytes:
    choice: dict = {"text": text, "finish_reason": finish}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"


@pytest.mark.parametrize("finish", ["stop", "length", "tool_calls"])
async def test_a_final_finish_ends_the_stream(finish):
    items = await _collect(_client(FakeEngine(_http(200, _chunk([5], None) + _chunk([6], finish) + b"data: [DONE]\n\n", SSE))))
    assert items == [Opened(None), EngineToken(5, None), EngineToken(6, finish)]


@pytest.mark.parametrize("finish", ["abort", "error", "something_new"])
async def test_any_other_finish_is_an_engine_failure_not_an_end(finish):
    """vLLM ends a stream with "abort" when it shuts down or preempts: passing it on would truncate the answer."""
    engine = FakeEngine(_http(200, _chunk([5], None) + _chunk([], finish, text="") + b"data: [DONE]\n\n", SSE))
    items = []
    with pytest.raises(EngineFailure) as failure:
        async for item in _client(engine).stream(ENDPOINT, {}, first_token_timeout=1, stall_timeout=1, attempt_id="c.0"):
            items.append(item)
    assert failure.value.reason == "engine_aborted" and repr(finish) in str(failure.value)
    assert items == [Opened(None), EngineToken(5, None)]


async def test_the_tokens_of_an_aborted_chunk_come_before_the_failure_and_are_not_final():
    engine = FakeEngine(_http(200, _chunk([5], None) + _chunk([6], "abort"), SSE))
    items = []
    with pytest.raises(EngineFailure) as failure:
        async for item in _client(engine).stream(ENDPOINT, {}, first_token_timeout=1, stall_timeout=1, attempt_id="c.0"):
            items.append(item)
    assert failure.value.reason == "engine_aborted"
    assert items == [Opened(None), EngineToken(5, None), EngineToken(6, None)]


@pytest.mark.parametrize("chunks", [
    _chunk(None, None) + _chunk(None, "length"),  # an old vLLM: text, never token ids
    _chunk([], None, text="hello"),
    _chunk(None, "stop", text=""),  # a finish that names no token
    _chunk([5], None) + _chunk(None, "length"),
])
async def test_output_without_token_ids_is_a_typed_failure_naming_the_minimum_vllm(chunks):
    from contract.engine_support import MIN_VLLM_VERSION

    with pytest.raises(EngineFailure) as failure:
        await _collect(_client(FakeEngine(_http(200, chunks, SSE))))
    assert failure.value.reason == "no_token_ids"
    assert "return_token_ids" in str(failure.value) and MIN_VLLM_VERSION in str(failure.value)


async def test_a_chunk_without_output_is_skipped():
    body = _chunk(None, None, text="") + _chunk([5], "length")
    items = await _collect(_client(FakeEngine(_http(200, body, SSE))))
    assert items == [Opened(None), EngineToken(5, "length")]


class _Watch:
    def __init__(self, answer: str | None) -> None:
        self.answer, self.calls = answer, 0

    async def __call__(self) -> str | None:
        self.calls += 1
        return self.answer


def _silent_after(*token_ids: int) -> FakeEngine:
    return FakeEngine(_http(200, _sse(*token_ids, finish_last=False), SSE, complete=False))


async def _watched(engine: FakeEngine, watch: _Watch, *, first_token_timeout: float, stall_timeout: float,
                   watch_after: float) -> tuple[list, EngineFailure]:
    items: list = []
    with pytest.raises(EngineFailure) as failure:
        async with asyncio.timeout(30):  # a guard against hanging, not a measurement
            async for item in _client(engine).stream(ENDPOINT, {}, first_token_timeout=first_token_timeout,
                                                     stall_timeout=stall_timeout, attempt_id="c.0", watch=watch,
                                                     watch_after=watch_after):
                items.append(item)
    return items, failure.value


async def test_a_silent_engine_that_left_routing_fails_before_the_stall_timeout():
    """A SIGTERMed vLLM stops sending and keeps its socket: the watch ends it, not the (here endless) stall timeout."""
    watch = _Watch("its lease was released or lapsed")
    items, failure = await _watched(_silent_after(5), watch, first_token_timeout=1, stall_timeout=3600, watch_after=0.01)
    assert failure.reason == "engine_left_routing" and "lease was released" in str(failure)
    assert items == [Opened(None), EngineToken(5, None)] and watch.calls == 1


async def test_a_silent_engine_still_routable_is_watched_until_the_stall_timeout():
    watch = _Watch(None)
    _, failure = await _watched(_silent_after(5), watch, first_token_timeout=1, stall_timeout=0.05, watch_after=0.01)
    assert failure.reason == "stall" and watch.calls >= 1


async def test_the_watch_is_not_asked_before_the_first_token():
    """Until the first token the attempt watches the lease itself (prefill may be long; a drain lets it finish)."""
    watch = _Watch("draining")
    _, failure = await _watched(_silent_after(), watch, first_token_timeout=0.05, stall_timeout=3600, watch_after=0.01)
    assert failure.reason == "stall" and watch.calls == 0


async def test_tokens_on_time_never_ask_the_watch():
    watch = _Watch("draining")
    engine = FakeEngine(_http(200, _sse(5, 6, 7) + b"data: [DONE]\n\n", SSE))
    items = [item async for item in _client(engine).stream(ENDPOINT, {}, first_token_timeout=10, stall_timeout=10,
                                                           attempt_id="c.0", watch=watch, watch_after=5.0)]
    assert items[-1] == EngineToken(7, "length") and watch.calls == 0


async def test_vllms_cached_tokens_after_the_finish_reach_the_finishing_token():
    """vLLM sends `prompt_tokens_details` only in its usage chunk after the finish: a session's RPO_context."""
    usage = b'data: {"choices": [], "usage": {"prompt_tokens": 40, "prompt_tokens_details": {"cached_tokens": 32}}}\n\n'
    body = _chunk([5], None) + _chunk([6], "length") + usage + b"data: [DONE]\n\n"
    payload = {"prompt": [1], "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    items = [item async for item in _client(FakeEngine(_http(200, body, SSE))).stream(
        ENDPOINT, payload, first_token_timeout=1, stall_timeout=1, attempt_id="cmpl-test.0")]
    assert items == [Opened(None), EngineToken(5, None), EngineToken(6, "length", 32)]
    # Without the usage chunk, or not asked for it, the finish ends the stream as before.
    plain = await _collect(_client(FakeEngine(_http(200, _chunk([5], None) + _chunk([6], "length") + usage, SSE))))
    assert plain == [Opened(None), EngineToken(5, None), EngineToken(6, "length")]
