"""SSE rendering and the HTTP responses of a stream: the gateway's hot path.

`FrameRenderer` turns a committed `Frame` into one SSE event with the
request's constant envelope encoded once; `render_frame` is the plain
reference it must match byte for byte (a unit test holds them equal).
`FrameStreamResponse` streams them and closes the engine stream the moment a
client leaves; `collect` builds the non-streamed body from the same frames.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from contextlib import aclosing
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse

from contract.openai import completion_body
from contract.session import SESSION_USAGE_KEY
from gateway.stream_request import StreamRequest
from gateway.token_log import Frame
from gateway.tool_calls import ToolCallParser, split_answer

class FrameStreamResponse(StreamingResponse):
    """A StreamingResponse that notices a client leaving even between tokens and always closes its iterator.

    Closing the iterator closes the engine stream, and the engine then drops the
    sequence from its batch: a client that leaves costs at most one more decode step.
    """

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        streaming = asyncio.create_task(self.stream_response(send))

        async def watch_disconnect() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    streaming.cancel()
                    return

        watcher = asyncio.create_task(watch_disconnect())
        try:
            await streaming
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # we are being cancelled ourselves (shutdown), not the client leaving
        except OSError:
            pass  # the client left while we wrote
        finally:
            watcher.cancel()
            streaming.cancel()
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


def _envelope(req: StreamRequest, frame: Frame, choices: list[dict]) -> dict:
    return {
        "id": req.request_id,
        "object": "chat.completion.chunk" if req.kind == "chat" else "text_completion",
        "created": req.created,
        "model": req.model,
        "choices": choices,
        "lifeline": {"request_id": req.request_id, "seq": frame.seq, "epoch": frame.epoch,
                     **({"continuation": frame.continuation} if frame.continuation else {})},
    }


def render_frame(req: StreamRequest, frame: Frame) -> str:
    if frame.kind == "done":
        return f"id: {frame.seq}\ndata: [DONE]\n\n"
    if frame.kind == "error":
        payload = {"error": frame.error, "lifeline": {"request_id": req.request_id, "seq": frame.seq, "epoch": frame.epoch}}
        return f"id: {frame.seq}\nevent: error\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n"
    if frame.kind == "usage":
        chunk = _envelope(req, frame, [])
        usage = dict(frame.usage or {})
        if (session := usage.pop(SESSION_USAGE_KEY, None)) is not None:
            chunk["lifeline"]["session"] = session
        chunk["usage"] = usage
    elif frame.kind == "role":
        chunk = _envelope(req, frame, [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}])
    else:
        if req.kind == "chat":
            delta = {"content": frame.text} if frame.token_ids else {}
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": frame.finish_reason}
        else:
            choice = {"index": 0, "text": frame.text, "logprobs": None, "finish_reason": frame.finish_reason}
        if req.return_token_ids:
            choice["token_ids"] = list(frame.token_ids)
        chunk = _envelope(req, frame, [choice])
    return f"id: {frame.seq}\ndata: {json.dumps(chunk, separators=(',', ':'))}\n\n"


_json_str = json.encoder.encode_basestring_ascii  # what json.dumps does to a str (ensure_ascii)


class FrameRenderer:
    """`render_frame` for one request, with the envelope encoded once instead of per token.

    A token frame is the request's constant envelope around three variable
    parts (text, finish_reason, token ids) and the lifeline seq/epoch; building
    and encoding the nested dicts per token was the largest cost of SSE
    encoding. The output is byte-identical to `render_frame` (a unit test
    holds them equal); every other kind of frame takes `render_frame`.
    """

    def __init__(self, req: StreamRequest) -> None:
        self.req = req
        rid = _json_str(req.request_id)
        obj = "chat.completion.chunk" if req.kind == "chat" else "text_completion"
        self.chat = req.kind == "chat"
        self.token_ids = req.return_token_ids
        self.head = f'data: {{"id":{rid},"object":"{obj}","created":{req.created},"model":{_json_str(req.model)},"choices":[{{"index":0,'
        self.lifeline = f'}}],"lifeline":{{"request_id":{rid},"seq":'

    def render(self, frame: Frame) -> str:
        if frame.kind != "token":
            return render_frame(self.req, frame)
        if self.chat:
            variable = f'"delta":{{"content":{_json_str(frame.text)}}}' if frame.token_ids else '"delta":{}'
        else:
            variable = f'"text":{_json_str(frame.text)}'
        finish = "null" if frame.finish_reason is None else _json_str(frame.finish_reason)
        ids = f',"token_ids":[{",".join(map(str, frame.token_ids))}]' if self.token_ids else ""
        continuation = f',"continuation":{_json_str(frame.continuation)}' if frame.continuation else ""
        return (f"id: {frame.seq}\n{self.head}{variable},\"logprobs\":null,\"finish_reason\":{finish}{ids}"
                f'{self.lifeline}{frame.seq},"epoch":{frame.epoch}{continuation}}}}}\n\n')


class ToolCallRenderer:
    """`render_frame` for a chat request that may call tools: each token frame's text split into content and
    whole tool calls (`gateway/tool_calls.py`). `history` is the frames a resuming client already has: fed
    first, so the frames after them render exactly as they did the first time."""

    def __init__(self, req: StreamRequest, history: Iterable[Frame] = ()) -> None:
        self.req = req
        self.parser = ToolCallParser(req.request_id, req.max_tool_calls)
        for frame in history:
            self._split(frame)

    def _split(self, frame: Frame) -> tuple[str, list[dict[str, Any]], str | None]:
        if frame.kind != "token":
            return "", [], None
        content, calls = self.parser.feed(frame.text)
        finish = frame.finish_reason
        if finish is not None:
            content += self.parser.finish()
            finish = self.parser.finish_reason(finish)
        return content, calls, finish

    def render(self, frame: Frame) -> str:
        if frame.kind != "token":
            return render_frame(self.req, frame)
        content, calls, finish = self._split(frame)
        delta: dict[str, Any] = {}
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = calls
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if self.req.return_token_ids:
            choice["token_ids"] = list(frame.token_ids)
        chunk = _envelope(self.req, frame, [choice])
        return f"id: {frame.seq}\ndata: {json.dumps(chunk, separators=(',', ':'))}\n\n"


async def sse_body(req: StreamRequest, frames: AsyncIterator[Any], history: Iterable[Frame] = ()) -> AsyncIterator[str]:
    """The SSE events of `frames`; `history`, the frames before them a resuming client has (tool-call requests
    render by what came before)."""
    render = ToolCallRenderer(req, history).render if req.parse_tool_calls else FrameRenderer(req).render
    async with aclosing(frames) as items:
        async for item in items:
            if isinstance(item, Frame):
                yield render(item)


async def collect(req: StreamRequest, frames: AsyncIterator[Any], headers: dict[str, str]) -> JSONResponse:
    text: list[str] = []
    token_ids: list[int] = []
    finish: str | None = None
    usage: dict[str, Any] | None = None
    session: dict[str, Any] | None = None
    continuation: str | None = None
    epoch = 0
    async with aclosing(frames) as items:
        async for item in items:
            if not isinstance(item, Frame):
                continue
            epoch = item.epoch
            if item.kind == "error":
                error = item.error or {}
                return JSONResponse({"error": error}, status_code=int(error.get("code") or 502), headers=headers)
            if item.kind == "token":
                text.append(item.text)
                token_ids.extend(item.token_ids)
                finish = item.finish_reason or finish
                continuation = item.continuation or continuation
            elif item.kind == "usage":
                usage = dict(item.usage or {})
                session = usage.pop(SESSION_USAGE_KEY, None)
    answer, calls = "".join(text), None
    if req.parse_tool_calls:
        answer, calls, finish = split_answer(req.request_id, answer, finish, max_calls=req.max_tool_calls)
    body = completion_body(kind="chat" if req.kind == "chat" else "completion", request_id=req.request_id,
                           created=req.created, model=req.model, text=answer, finish_reason=finish,
                           token_ids=token_ids if req.return_token_ids else None, usage_=usage,
                           tool_calls=calls or None)
    body["lifeline"] = {"request_id": req.request_id, "epoch": epoch}
    if continuation is not None:
        body["lifeline"]["continuation"] = continuation
    if session is not None:
        body["lifeline"]["session"] = session
    return JSONResponse(body, headers=headers)
