"""The reference engine over real HTTP: vLLM's API subset, determinism, bad input."""

from __future__ import annotations

import concurrent.futures
import json
import re
import time

import pytest

from common import oneshot_http
from contract.sampling import Sampling, identify_request, sampling_from_answer
from tests.support.sse import complete, stream_completion

MODEL = "tiny-seed0"
PROMPT = "The standby region serves every request"


@pytest.fixture(scope="module")
def engine(module_engine_factory):
    return module_engine_factory("api-engine")


def _body(**overrides) -> dict:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 32, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True}
    return {**body, **overrides}


def test_stream_carries_token_ids_and_ends_with_done(engine) -> None:
    result = stream_completion(engine.url, _body())
    assert result.done and result.finish_reason == "length"
    assert len(result.token_ids) == 32
    assert all(len(c["choices"][0]["token_ids"]) == 1 for c in result.chunks)
    prompt_ids = result.chunks[0]["prompt_token_ids"]
    assert prompt_ids and "prompt_token_ids" not in result.chunks[1]
    blocking = complete(engine.url, _body()).json()
    assert blocking["choices"][0]["token_ids"] == result.token_ids
    assert blocking["choices"][0]["text"] == result.text
    assert blocking["prompt_token_ids"] == prompt_ids
    # The second request restores the prompt's whole blocks from the prefix cache, and says so (vLLM's field).
    restored = (len(prompt_ids) - 1) // 16 * 16
    assert blocking["usage"] == {"prompt_tokens": len(prompt_ids), "completion_tokens": 32,
                                 "total_tokens": len(prompt_ids) + 32, "prompt_tokens_details": {"cached_tokens": restored}}


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 0.9, "top_p": 0.95, "seed": 1234}],
                         ids=["greedy", "seeded"])
def test_resubmitted_prefix_yields_exactly_the_remaining_tokens(engine, sampling: dict) -> None:
    full = stream_completion(engine.url, _body(max_tokens=40, **sampling)).token_ids
    prompt_ids = complete(engine.url, _body(max_tokens=1)).json()["prompt_token_ids"]
    assert full == stream_completion(engine.url, _body(max_tokens=40, **sampling)).token_ids
    for k in (1, 13, 39):
        rest = stream_completion(engine.url, _body(prompt=prompt_ids + full[:k], max_tokens=40 - k, **sampling))
        assert rest.token_ids == full[k:], f"resume after {k} tokens diverged"


def test_unseeded_sampling_differs_between_requests(engine) -> None:
    first = stream_completion(engine.url, _body(temperature=1.0)).token_ids
    second = stream_completion(engine.url, _body(temperature=1.0)).token_ids
    assert first != second


def test_sixteen_concurrent_streams_match_their_solo_runs(engine) -> None:
    prompts = [f"Request {i} drains zone {i % 3}" for i in range(16)]
    solo = [stream_completion(engine.url, _body(prompt=p, max_tokens=20)).token_ids for p in prompts[:4]]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(stream_completion, engine.url, _body(prompt=p, max_tokens=20)) for p in prompts]
        # The event loop stays responsive while the decode loop is busy.
        assert oneshot_http.get(f"{engine.url}/healthz/live", timeout=5).status_code == 200
        results = [f.result() for f in futures]
    assert all(r.done and len(r.token_ids) == 20 for r in results)
    assert [r.token_ids for r in results[:4]] == solo


def test_chat_completion_applies_the_chat_template(engine) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Is the canary healthy?"}],
            "max_tokens": 8, "temperature": 0, "return_token_ids": True, "ignore_eos": True}
    response = oneshot_http.post(f"{engine.url}/v1/chat/completions", json=body, timeout=30).json()
    assert response["object"] == "chat.completion"
    assert response["choices"][0]["message"]["role"] == "assistant"
    assert len(response["choices"][0]["token_ids"]) == 8
    start_id = response["prompt_token_ids"][0]
    models = oneshot_http.get(f"{engine.url}/v1/models").json()
    assert models["data"][0]["id"] == MODEL
    plain = complete(engine.url, {"model": MODEL, "prompt": "<|im_start|>", "max_tokens": 1}).json()
    assert plain["usage"]["prompt_tokens"] == 1 and start_id == complete(
        engine.url, {"model": MODEL, "prompt": "<|im_start|>", "max_tokens": 1, "return_token_ids": True}
    ).json()["prompt_token_ids"][0]


def test_stop_string_ends_the_stream_without_emitting_it(engine) -> None:
    full = complete(engine.url, _body(max_tokens=30)).json()["choices"][0]["text"]
    stop = full[10:14]
    assert stop.strip(), "need a visible stop string"
    result = stream_completion(engine.url, _body(max_tokens=30, stop=[stop]))
    assert result.finish_reason == "stop"
    assert result.text == full[: full.index(stop)]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "no-such-model", "prompt": "x", "max_tokens": 4}, "model"),
        ({"model": MODEL, "prompt": "", "max_tokens": 4}, "prompt"),
        ({"model": MODEL, "prompt": [], "max_tokens": 4}, "prompt"),
        ({"model": MODEL, "prompt": [1, 2, 999999], "max_tokens": 4}, "prompt"),
        ({"model": MODEL, "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"model": MODEL, "prompt": "x", "max_tokens": -3}, "max_tokens"),
        ({"model": MODEL, "prompt": "x", "max_tokens": 5000}, "max_tokens"),
        ({"model": MODEL, "prompt": "x", "max_tokens": 4, "temperature": -1}, "temperature"),
        ({"model": MODEL, "prompt": "x", "max_tokens": 4, "n": 2}, "n"),
        ({"model": MODEL, "max_tokens": 4}, "prompt"),
    ],
)
def test_bad_input_gets_openai_style_400_and_engine_keeps_serving(engine, body: dict, param: str) -> None:
    response = oneshot_http.post(f"{engine.url}/v1/completions", json=body, timeout=10)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400
    assert error["param"] == param and error["message"]
    assert complete(engine.url, _body(max_tokens=2)).status_code == 200


def test_malformed_json_gets_400(engine) -> None:
    for raw in (b"{not json", b"[1, 2]", b"\xff\xfe"):
        response = oneshot_http.post(f"{engine.url}/v1/completions", content=raw,
                                     headers={"content-type": "application/json"}, timeout=10)
        assert response.status_code == 400
        assert response.json()["error"]["type"] == "BadRequestError"


def _metric(engine, name: str, labels: str = "") -> float:
    text = oneshot_http.get(f"{engine.url}/metrics", timeout=5).text
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name}{labels} missing from /metrics"
    return float(match.group(1))


def test_metrics_count_tokens_and_requests(engine) -> None:
    before = _metric(engine, "vllm:generation_tokens_total")
    stream_completion(engine.url, _body(max_tokens=12))
    assert _metric(engine, "vllm:generation_tokens_total") == before + 12
    assert _metric(engine, "vllm:num_requests_running") == 0
    assert _metric(engine, "vllm:num_requests_waiting") == 0
    assert _metric(engine, "lifeline_engine_ready") == 1


def test_client_disconnect_stops_generation_within_a_step(engine) -> None:
    aborted = _metric(engine, "lifeline_engine_requests_total", '{outcome="aborted"}') if "aborted" in oneshot_http.get(f"{engine.url}/metrics").text else 0.0
    partial = stream_completion(engine.url, _body(max_tokens=3000), max_chunks=3)
    assert len(partial.token_ids) == 3
    deadline = time.monotonic() + 10
    while _metric(engine, "vllm:num_requests_running") != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    settled = _metric(engine, "vllm:generation_tokens_total")
    time.sleep(0.5)
    assert _metric(engine, "vllm:generation_tokens_total") == settled
    assert _metric(engine, "lifeline_engine_requests_total", '{outcome="aborted"}') == aborted + 1


def test_logprobs_are_reported_for_each_sampled_token(engine) -> None:
    response = complete(engine.url, _body(max_tokens=5, logprobs=3)).json()
    logprobs = response["choices"][0]["logprobs"]
    assert len(logprobs["token_logprobs"]) == 5 and len(logprobs["top_logprobs"]) == 5
    for chosen, top in zip(logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True):
        assert chosen <= 0.0 and len(top) == 3
        assert chosen >= max(top.values()) - 1e-9  # greedy picks the most likely token


@pytest.mark.parametrize(("path", "caller_id", "expected"), [
    ("/v1/completions", "cmpl-gw42.1", "cmpl-gw42.1"),
    ("/v1/completions", "gw42.2", "cmpl-gw42.2"),
    ("/v1/chat/completions", "chatcmpl-gw42.3", "chatcmpl-gw42.3"),
    ("/v1/chat/completions", "gw42.4", "chatcmpl-gw42.4"),
])
def test_caller_request_id_gets_the_prefix_once(engine, path: str, caller_id: str, expected: str) -> None:
    body = _body(max_tokens=2)
    if "chat" in path:
        body = {**{k: v for k, v in body.items() if k != "prompt"}, "messages": [{"role": "user", "content": "hi"}]}
    for stream in (False, True):
        response = oneshot_http.post(f"{engine.url}{path}", json={**body, "stream": stream},
                                     headers={"X-Request-Id": caller_id}, timeout=30)
        first = response.json() if not stream else json.loads(response.text.split("data: ", 2)[1])
        assert first["id"] == expected
    assert f'"request_id": "{expected}"' in engine.logs()


def test_bad_caller_request_id_is_refused(engine) -> None:
    bad = oneshot_http.post(f"{engine.url}/v1/completions", json=_body(max_tokens=2),
                            headers={"X-Request-Id": "two words"}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "X-Request-Id"


def test_the_engine_answers_the_sampler_question_as_lifelines_vllm_sampler_does(engine) -> None:
    """contract/sampling.py: the agent asks every engine before its first lease; this one is position-keyed."""
    answer = oneshot_http.post(f"{engine.url}/v1/completions", json=identify_request(MODEL), timeout=10)
    assert sampling_from_answer(answer.status_code, answer.text) is Sampling.POSITION_KEYED, answer.text
    other = oneshot_http.post(f"{engine.url}/v1/completions", timeout=10,
                              json={**identify_request(MODEL), "vllm_xargs": {"unrelated": 1}})
    assert other.status_code == 200, other.text  # like vLLM, other extra arguments change nothing
