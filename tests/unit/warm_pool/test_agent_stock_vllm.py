"""The agent's stock-vLLM path on scripted answers (httpx.MockTransport): bare URLs, the first-lease check, commands.

The real-vLLM tests are tests/e2e/vllm/test_agent_vllm.py and test_pool_vllm.py; here each rule on its own.
"""

from __future__ import annotations

import json
from datetime import timedelta

import httpx
import pytest
from pydantic import ValidationError

from common.clock import ManualClock
from lifeline import vllm as lifeline_vllm
from warm_pool.agent import Agent
from warm_pool.settings import AgentSettings, EngineCommand, PoolSettings
from warm_pool.support import SupportUnknown, UnsupportedEngine, check_token_ids

from tests.unit.warm_pool.test_pool_agent import MemoryRegistry

METRICS = ("vllm:num_requests_running{engine=\"0\",model_name=\"v9\"} 0.0\n"
           "vllm:num_requests_waiting{engine=\"0\",model_name=\"v9\"} 0.0\n"
           "vllm:prompt_tokens_total{engine=\"0\",model_name=\"v9\"} 0.0\n"
           "vllm:generation_tokens_total{engine=\"0\",model_name=\"v9\"} 0.0\n"
           "process_start_time_seconds 100.0\n")


def sse(*chunks: dict | str) -> bytes:
    return b"".join(f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n".encode() for c in chunks)


def stream(token_ids: bool = True) -> httpx.Response:
    chunks = [{"choices": [{"index": 0, "text": t, **({"token_ids": [i]} if token_ids else {}),
                            "finish_reason": None}]} for i, t in ((5, " a"), (6, " b"))]
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=sse(*chunks, "[DONE]"))


def stock_vllm(completions: httpx.Response | None = None, seen: list[str] | None = None) -> httpx.MockTransport:
    """What stock vLLM answers: no /healthz/*, /health, its one served model, its /metrics, streamed completions."""
    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request.url.path)
        path = request.url.path
        if path == "/health":
            return httpx.Response(200)
        if path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "v9", "object": "model"}]})
        if path == "/metrics":
            return httpx.Response(200, text=METRICS)
        if path == "/v1/completions":
            return completions or stream()
        return httpx.Response(404, json={"detail": "Not Found"})

    return httpx.MockTransport(handler)


@pytest.mark.parametrize(("name", "answer", "raised", "says"), [
    ("old vLLM: text alone", stream(token_ids=False), UnsupportedEngine, "per-token ids"),
    ("refused the request", httpx.Response(400, json={"error": {"message": "extra fields"}}), UnsupportedEngine,
     "refused"),
    ("not a stream", httpx.Response(200, headers={"content-type": "text/event-stream"}, content=b"data: {oops\n\n"),
     UnsupportedEngine, "stream format"),
    ("busy: ask again", httpx.Response(503), SupportUnknown, "503"),
])
async def test_the_first_lease_check_refuses_what_recovery_cannot_use(name, answer, raised, says) -> None:
    async with httpx.AsyncClient(transport=stock_vllm(answer)) as client:
        with pytest.raises(raised) as caught:
            await check_token_ids(client, "http://e", model="v9")
    assert says in str(caught.value), name
    if raised is UnsupportedEngine:
        assert caught.value.error_type == "unsupported_engine" and "0.10.2" in str(caught.value)


async def test_a_streamed_chunk_with_token_ids_passes() -> None:
    async with httpx.AsyncClient(transport=stock_vllm()) as client:
        await check_token_ids(client, "http://e", model="v9")


async def test_a_bare_url_of_stock_vllm_is_leased_under_its_served_model_name() -> None:
    seen: list[str] = []
    registry = MemoryRegistry(ManualClock())
    async with httpx.AsyncClient(transport=stock_vllm(seen=seen)) as http:
        agent = Agent(AgentSettings(region="r1", renew_leases_for="http://vllm-a-0.vllm.ns.svc:8000"),
                      registry=registry, http=http, clock=ManualClock())
        await agent.tick()
        [lease] = await registry.live()
        assert (lease.instance_id, lease.version, lease.zone, lease.url) == (
            "vllm-a-0", "v9", "unknown", "http://vllm-a-0.vllm.ns.svc:8000")
        instance = agent.instances["vllm-a-0"]
        assert instance.stock_vllm and instance.supported
        seen.clear()
        await agent.tick()
        assert "/healthz/live" not in seen and {"/health", "/metrics"} <= set(seen)  # one GET for health, not two
        await agent.close()


async def test_an_engine_without_token_ids_is_never_leased_and_says_why() -> None:
    registry = MemoryRegistry(ManualClock())
    async with httpx.AsyncClient(transport=stock_vllm(stream(token_ids=False))) as http:
        agent = Agent(AgentSettings(region="r1", renew_leases_for="http://127.0.0.1:8000"),
                      registry=registry, http=http, clock=ManualClock())
        for _ in range(3):
            await agent.tick()
        assert await registry.live() == []
        status = agent.status()["instances"]["127.0.0.1-8000"]
        assert status["unleasable"].startswith("unsupported_engine:") and "0.10.2" in status["unleasable"]
        assert agent.metrics.registry.get_sample_value("lifeline_agent_unsupported_engines_total") == 1.0
        await agent.close()


def test_a_command_template_names_only_known_placeholders() -> None:
    command = EngineCommand(argv=["serve", "--model", "{model_dir}", "--port", "{port}", "--name", "{version}"])
    assert command.render(model_dir="/m", port="9", version="v1", instance_id="i", zone="z", region="r",
                          state_dir="/s") == ["serve", "--model", "/m", "--port", "9", "--name", "v1"]
    with pytest.raises(ValidationError, match=r"argv\[1\] '\{gpu\}': unknown placeholder"):
        EngineCommand(argv=["serve", "{gpu}"])


def test_vllms_pool_command_is_a_valid_template() -> None:
    command = EngineCommand(**lifeline_vllm.pool_command(shutdown_timeout=20, logits_processor=False))
    argv = command.render(model_dir="/m", port="9", version="v1", instance_id="i", zone="z", region="r",
                          state_dir="/s")
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--shutdown-timeout") + 1] == "20" and argv[argv.index("--served-model-name") + 1] == "v1"
    assert command.stop_timeout > timedelta(seconds=20)  # SIGKILL only after vLLM's own drain


@pytest.mark.parametrize(("pool", "says"), [
    ({"driver": "local", "state_dir": "/s", "commands": {"v2": {"argv": ["x"]}}}, "pool.commands: ['v2']"),
    ({"driver": "kubernetes", "kubernetes": {"image": "i"}, "commands": {"v1": {"argv": ["x"]}}},
     "pool.commands is for the local driver"),
])
def test_commands_are_the_local_drivers_and_name_known_versions(pool: dict, says: str) -> None:
    with pytest.raises(ValidationError, match=says.replace("[", r"\[").replace("]", r"\]")):
        PoolSettings(model="m", versions={"v1": "/m/v1"}, zones={"z": {"serving": 1, "warm": 0}}, **pool)


def test_stall_timeout_is_longer_than_a_probe_interval() -> None:
    with pytest.raises(ValidationError, match="stall_timeout"):
        AgentSettings(region="r", probe_interval=0.5, stall_timeout=0.5)
