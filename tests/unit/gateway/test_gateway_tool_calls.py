"""Tool calling through the gateway: tools and tool history rendered, calls parsed once, whole, on any replay.

The split is tested on the real tokenizer's pieces (one frame per token, as
the gateway commits them): whatever frame a client resumes after, what it
had plus what it gets is the whole answer's rendering, so a call can be
neither repeated nor cut.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from contract.openai import ChatMessage
from gateway.app import create_app
from gateway.settings import GatewaySettings, RecoveryStrategy
from gateway.sse import ToolCallRenderer, collect
from gateway.stream_request import StreamRequest
from gateway.token_log import Frame
from gateway.tool_calls import ToolCallParser, call_id, split_answer

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "today's weather",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
HISTORY = [
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "-3 C, snow"},
]
ANSWER = ('Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Bergen"}}\n</tool_call>'
          '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tromsø"}}\n</tool_call>')


def request(**overrides: object) -> StreamRequest:
    fields = {"request_id": "chatcmpl-1", "kind": "chat", "model": "tiny", "version": "v", "prompt_ids": [1],
              "max_tokens": 64, "sampling": {}, "stop": [], "strategy": RecoveryStrategy.TOKEN_COMMIT_RESUME,
              "deadline_wall": 0.0, "created": 0, "parse_tool_calls": True, **overrides}
    return StreamRequest(**fields)  # type: ignore[arg-type]


def token_frames(tiny_model: Path, text: str, finish: str = "stop") -> list[Frame]:
    """The answer as the gateway commits it: one frame per token, each with the text that token adds."""
    from tokenizers import Tokenizer

    from common.detokenize import IncrementalDetokenizer

    tokenizer = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    detokenizer = IncrementalDetokenizer(tokenizer)
    frames = []
    for seq, token in enumerate(ids):
        last = seq == len(ids) - 1
        piece = detokenizer.push(token) + (detokenizer.flush() if last else "")
        frames.append(Frame(seq=seq + 1, kind="token", epoch=0, token_ids=(token,), text=piece,
                            finish_reason=finish if last else None))
    assert "".join(f.text for f in frames) == text
    return frames


def rendered(req: StreamRequest, frames: list[Frame], history: list[Frame] | None = None) -> list[dict]:
    renderer = ToolCallRenderer(req, history or [])
    return [json.loads(renderer.render(f).split("data: ", 1)[1]) for f in frames]


def deltas(chunks: list[dict]) -> tuple[str, list[dict], str | None]:
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    calls = [call for c in chunks for call in c["choices"][0]["delta"].get("tool_calls", [])]
    return content, calls, chunks[-1]["choices"][0]["finish_reason"]


def test_calls_are_emitted_whole_once_and_the_text_around_them_is_content(tiny_model: Path) -> None:
    frames = token_frames(tiny_model, ANSWER)
    chunks = rendered(request(), frames)
    content, calls, finish = deltas(chunks)
    assert content == "Let me check. " and finish == "tool_calls"
    assert [(c["index"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        (0, "get_weather", {"city": "Bergen"}), (1, "get_weather", {"city": "Tromsø"})]
    assert [c["id"] for c in calls] == [call_id("chatcmpl-1", 0), call_id("chatcmpl-1", 1)]
    assert len(chunks) == len(frames)  # every token keeps its own event (and seq)
    assert [c["lifeline"]["seq"] for c in chunks] == [f.seq for f in frames]


def test_a_client_resuming_after_any_frame_gets_exactly_the_rest(tiny_model: Path) -> None:
    frames = token_frames(tiny_model, ANSWER)
    whole = rendered(request(), frames)
    for cut in range(len(frames)):
        assert whole[:cut] + rendered(request(), frames[cut:], frames[:cut]) == whole, cut


def test_malformed_or_unclosed_calls_are_the_models_text_not_calls(tiny_model: Path) -> None:
    broken = 'A <tool_call>{"name": 3}</tool_call> B <tool_call>\n{"name": "get_weather", "argu'
    content, calls, finish = deltas(rendered(request(), token_frames(tiny_model, broken, finish="length")))
    assert (content, calls, finish) == (broken, [], "length")
    assert split_answer("r", "a < b <tool", "stop") == ("a < b <tool", [], "stop")


def test_a_partial_tag_is_held_back_until_it_is_decided() -> None:
    parser = ToolCallParser("r")
    assert parser.feed("2 <tool") == ("2 ", [])
    assert parser.feed("s> are fine") == ("<tools> are fine", [])


def test_the_non_streamed_answer_carries_the_calls_and_null_content() -> None:
    content, calls, finish = split_answer("chatcmpl-9", '<tool_call>{"name": "f", "arguments": {}}</tool_call>',
                                          "stop")
    assert (content, finish) == ("", "tool_calls")
    assert calls == [{"id": call_id("chatcmpl-9", 0), "type": "function", "function": {"name": "f", "arguments": "{}"}}]


async def test_collect_builds_the_openai_message_with_tool_calls() -> None:
    async def frames():
        yield Frame(seq=1, kind="token", epoch=0, token_ids=(5,), text='ok<tool_call>{"name": "f", "arguments": ')
        yield Frame(seq=2, kind="token", epoch=1, token_ids=(6,), text='{"x": 1}}</tool_call>', finish_reason="stop")
        yield Frame(seq=3, kind="done", epoch=1)

    response = await collect(request(stream=False), frames(), {})
    choice = json.loads(response.body)["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "ok"
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"x": 1}'}


def test_history_messages_keep_their_tool_fields_and_bad_ones_are_refused() -> None:
    assistant = ChatMessage.model_validate(HISTORY[1])
    assert assistant.template_dict()["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    assert ChatMessage.model_validate(HISTORY[2]).template_dict()["tool_call_id"] == "call_1"
    for bad in ({"role": "tool", "content": "x"},  # answers no call
                {"role": "user", "content": "x", "tool_call_id": "c"},
                {"role": "assistant", "content": None},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {
                    "name": "f", "arguments": "not json"}}]},
                {"role": "user", "content": "x", "refusal": "no"},  # an echoed field that carries something
                {"role": "user", "content": "x", "unknown": 1}):
        with pytest.raises(ValidationError):
            ChatMessage.model_validate(bad)


@pytest.fixture
def client(tiny_model: Path):
    settings = GatewaySettings(models=[{"alias": "tiny", "version": tiny_model.name, "model_dir": tiny_model}])
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        yield c


def test_tools_and_tool_history_pass_validation_and_reach_routing(client: TestClient) -> None:
    response = client.post("/v1/chat/completions", json={"model": "tiny", "messages": HISTORY, "tools": TOOLS})
    assert response.status_code == 503 and response.json()["error"]["type"] == "no_healthy_endpoint"


def test_a_model_whose_template_cannot_render_tools_is_refused_not_silently_stripped(
        tiny_model: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain-chatml"
    shutil.copytree(tiny_model, plain)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config["chat_template"] = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
                               "message['content'] + '<|im_end|>\\n' }}{% endfor %}")
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    settings = GatewaySettings(models=[{"alias": "plain", "version": plain.name, "model_dir": plain}])
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        offered = c.post("/v1/chat/completions", json={"model": "plain", "messages": HISTORY[:1], "tools": TOOLS})
        assert offered.status_code == 400 and offered.json()["error"]["param"] == "tools"
        history = c.post("/v1/chat/completions", json={"model": "plain", "messages": HISTORY})
        assert history.status_code == 400 and history.json()["error"]["param"] == "messages.1"


def test_parallel_tool_calls_false_keeps_the_first_call_and_drops_the_rest(tiny_model: Path) -> None:
    """As vLLM filters them: the later calls are neither calls nor content, on every path and every resume."""
    frames = token_frames(tiny_model, ANSWER + " done")
    single = request(max_tool_calls=1)
    whole = rendered(single, frames)
    content, calls, finish = deltas(whole)
    assert (content, finish) == ("Let me check.  done", "tool_calls")
    assert [(c["index"], json.loads(c["function"]["arguments"])) for c in calls] == [(0, {"city": "Bergen"})]
    for cut in range(len(frames)):
        assert whole[:cut] + rendered(single, frames[cut:], frames[:cut]) == whole, cut
    text, [call], _ = split_answer("r", ANSWER, "stop", max_calls=1)
    assert text == "Let me check. " and json.loads(call["function"]["arguments"]) == {"city": "Bergen"}


def test_parallel_tool_calls_is_a_boolean_of_chat_and_refused_on_completions(client: TestClient) -> None:
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "max_tokens": 4}
    assert client.post("/v1/chat/completions", json={**chat, "parallel_tool_calls": "sometimes"}).status_code == 400
    completion = client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "parallel_tool_calls": False})
    assert completion.status_code == 400
    assert completion.json()["error"]["param"] == "parallel_tool_calls"
