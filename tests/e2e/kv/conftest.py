"""Helpers for the KV checkpoint end-to-end tests: greedy completions and metrics of real engines."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from common import oneshot_http
from lifeline.processes import EngineProcess, scrape_metric

PROMPT = ("Every region keeps a warm pool; when one zone is lost the gateway moves each stream to another "
          "engine, which continues from the committed prefix without a gap or a duplicate token. ") * 3


def completion(engine: EngineProcess, prompt: str | list[int], max_tokens: int, **extra: Any) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "return_token_ids": True, **extra}
    response = oneshot_http.post(f"{engine.url}/v1/completions", json=body, timeout=120)
    response.raise_for_status()
    return response.json()["choices"][0]


def tokens(engine: EngineProcess, prompt: str | list[int], max_tokens: int, **extra: Any) -> list[int]:
    return completion(engine, prompt, max_tokens, **extra)["token_ids"]


def prompt_ids(engine: EngineProcess, prompt: str) -> list[int]:
    return completion(engine, prompt, 1)["prompt_token_ids"]


def metric(engine: EngineProcess, name: str, labels: dict[str, str] | None = None) -> float:
    return scrape_metric(f"{engine.url}/metrics", name, labels)


def kv_summary(engine: EngineProcess) -> dict[str, Any]:
    response = oneshot_http.get(f"{engine.url}/admin/kv", timeout=10)
    response.raise_for_status()
    return response.json()


def log_records(engine: EngineProcess, event: str) -> list[dict[str, Any]]:
    found = []
    for line in engine.logs().splitlines():
        if f'"{event}"' in line:
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return found


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[Any]:
    """moto's S3 server (AWS emulated), a real HTTP endpoint the engines' boto3 clients talk to."""
    from lifeline.daemons import MotoServer

    server = MotoServer()
    server.start()
    yield server
    server.stop()
