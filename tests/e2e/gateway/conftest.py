"""Module-scoped gateways and engines for the gateway end-to-end tests.

Engines take seconds to start, so a module shares one gateway and its
survivor engines across cases; each kill case starts a fresh victim engine
(a dead process cannot be reused) under the same instance id, which the
registry then gives a higher generation.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import connect_sse

from common import oneshot_http
from lifeline.processes import built_model, free_port
from lifeline.processes import EngineProcess
from lifeline.processes import GatewayProcess


@dataclass
class Cluster:
    """One gateway and the engines it routes to, torn down together."""

    workdir: Path
    model: Path
    gateways: list[GatewayProcess]
    engines: list[EngineProcess]

    @property
    def gateway(self) -> GatewayProcess:
        return self.gateways[0]

    def start_gateway(self, config: dict[str, Any], replica_id: str = "gateway-0") -> GatewayProcess:
        gw = GatewayProcess(config, free_port(), self.workdir, replica_id=replica_id)
        self.gateways.append(gw)
        gw.start()
        gw.wait_live()
        return gw

    def start_engine(self, instance_id: str, extra_args: list[str] | None = None, *, registry: list[str] | None = None,
                     wait: bool = True) -> EngineProcess:
        args = [*(registry if registry is not None else self.gateway.registry_args()), *(extra_args or [])]
        engine = EngineProcess(self.model, free_port(), instance_id, self.workdir / "state" / instance_id,
                               self.workdir / f"{instance_id}-{len(self.engines)}.log", extra_args=args)
        self.engines.append(engine)
        engine.start()
        if wait:
            engine.wait_ready()
        return engine

    def close(self) -> None:
        for engine in self.engines:
            engine.kill()
        for gw in self.gateways:
            gw.kill()


@pytest.fixture(scope="module")
def cluster_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    clusters: list[Cluster] = []

    def make() -> Cluster:
        cluster = Cluster(tmp_path_factory.mktemp("cluster"), built_model("tiny", 0), [], [])
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        cluster.close()


@dataclass
class StreamResult:
    events: list[tuple[str, str, str]]  # (id, event, data)
    chunks: list[dict]
    token_ids: list[int]
    seqs: list[int]
    epochs: list[int]
    finish_reason: str | None
    error: dict | None
    done: bool
    request_id: str | None


def parse_events(events: list[tuple[str, str, str]]) -> StreamResult:
    chunks, token_ids, seqs, epochs = [], [], [], []
    finish, error, done, request_id = None, None, False, None
    for event_id, event, data in events:
        seqs.append(int(event_id))
        if data == "[DONE]":
            done = True
            continue
        payload = json.loads(data)
        if event == "error":
            error = payload["error"]
            continue
        chunks.append(payload)
        request_id = payload["lifeline"]["request_id"]
        assert payload["lifeline"]["seq"] == int(event_id)
        epochs.append(payload["lifeline"]["epoch"])
        for choice in payload["choices"]:
            token_ids.extend(choice.get("token_ids") or [])
            finish = choice.get("finish_reason") or finish
    return StreamResult(events, chunks, token_ids, seqs, epochs, finish, error, done, request_id)


def stream(url: str, body: dict, headers: dict[str, str] | None = None, *, path: str = "/v1/completions",
           stop_after: int | None = None, timeout: float = 120.0) -> StreamResult:
    """POST a streaming request; read every SSE event (or `stop_after` of them, then hang up)."""
    events: list[tuple[str, str, str]] = []
    with httpx.Client(timeout=timeout) as client:
        with connect_sse(client, "POST", url + path, json={**body, "stream": True}, headers=headers or {}) as source:
            assert source.response.status_code == 200, source.response.read()
            for sse in source.iter_sse():
                events.append((sse.id, sse.event, sse.data))
                if stop_after is not None and len(events) >= stop_after:
                    break
    return parse_events(events)


def resume(url: str, request_id: str, last_event_id: int | None, *, timeout: float = 120.0) -> StreamResult:
    events: list[tuple[str, str, str]] = []
    headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
    with httpx.Client(timeout=timeout) as client:
        with connect_sse(client, "GET", f"{url}/v1/streams/{request_id}", headers=headers) as source:
            assert source.response.status_code == 200, source.response.read()
            for sse in source.iter_sse():
                events.append((sse.id, sse.event, sse.data))
    return parse_events(events)


def direct_tokens(engine_url: str, model: Path, body: dict) -> list[int]:
    """The unfaulted run, straight from an engine."""
    payload = {**body, "model": model.name, "stream": False, "return_token_ids": True}
    response = oneshot_http.post(f"{engine_url}/v1/completions", json=payload, timeout=120)
    response.raise_for_status()
    return response.json()["choices"][0]["token_ids"]
