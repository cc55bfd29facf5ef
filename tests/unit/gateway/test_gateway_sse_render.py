"""The per-request SSE renderer is byte-identical to the reference `render_frame`."""

from __future__ import annotations

import json

import pytest

from gateway.sse import FrameRenderer, render_frame
from gateway.stream_request import StreamRequest
from gateway.settings import RecoveryStrategy
from gateway.token_log import Frame


def _request(kind: str, *, return_token_ids: bool, model: str = "tiny") -> StreamRequest:
    return StreamRequest(
        request_id=("chatcmpl-" if kind == "chat" else "cmpl-") + "0123abcd", kind=kind, model=model, version="tiny-seed0",
        prompt_ids=[1, 2], max_tokens=8, sampling={}, stop=[], strategy=RecoveryStrategy.TOKEN_COMMIT_RESUME,
        deadline_wall=0.0, created=1_700_000_000, return_token_ids=return_token_ids,
    )


FRAMES = [
    Frame(seq=0, kind="role", epoch=0),
    Frame(seq=1, kind="token", epoch=0, token_ids=(17,), text="hello"),
    Frame(seq=2, kind="token", epoch=1, token_ids=(5, 6), text=' "quoted"\\ \n\t\u00e9\u4e2d\U0001f600'),
    Frame(seq=3, kind="token", epoch=1, token_ids=(9,), text=""),
    Frame(seq=4, kind="token", epoch=2, token_ids=(9,), text="end", finish_reason="length", continuation="may_differ"),
    Frame(seq=5, kind="token", epoch=2, finish_reason="error"),
    Frame(seq=6, kind="usage", epoch=2, usage={"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}),
    Frame(seq=7, kind="error", epoch=2, error={"type": "migration_limit", "message": "x", "code": 502}),
    Frame(seq=8, kind="done", epoch=2),
]


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("return_token_ids", [False, True])
@pytest.mark.parametrize("model", ["tiny", 'we"ird/\u00fcmodel'])
def test_fast_renderer_matches_the_reference(kind, return_token_ids, model):
    req = _request(kind, return_token_ids=return_token_ids, model=model)
    renderer = FrameRenderer(req)
    for frame in FRAMES:
        assert renderer.render(frame) == render_frame(req, frame)


def test_token_frames_parse_as_openai_chunks_with_the_lifeline_object():
    req = _request("completion", return_token_ids=True)
    event = FrameRenderer(req).render(FRAMES[2])
    seq_line, data_line = event.rstrip("\n").split("\n")
    assert seq_line == "id: 2"
    chunk = json.loads(data_line.removeprefix("data: "))
    assert chunk["choices"][0]["text"] == FRAMES[2].text
    assert chunk["lifeline"] == {"request_id": req.request_id, "seq": 2, "epoch": 1}


def test_an_inexact_continuation_is_said_in_the_lifeline_object():
    req = _request("chat", return_token_ids=False)
    chunk = json.loads(FrameRenderer(req).render(FRAMES[4]).rstrip("\n").split("\n")[1].removeprefix("data: "))
    assert chunk["lifeline"] == {"request_id": req.request_id, "seq": 4, "epoch": 2, "continuation": "may_differ"}
