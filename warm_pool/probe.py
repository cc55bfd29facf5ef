"""Three-level health probes and the canary, each ending in one typed verdict.

    /healthz/live        the process answers (and, with the engine's watchdog, its decode loop steps)
    /healthz/ready       it takes new requests; 503 `draining` is a planned exit
    /healthz/generation  it serves the weight version the snapshot's alias names, with the catalog's digest
    canary               a recorded greedy prompt (contract.canary): token count, time to first token, output

Verdicts and what a gateway does with them (issue 10; Envoy's outlier
detection ejects on errors alone and vLLM's /health says only that the
process is up, so neither sees corrupted weights that answer 200):

    ok                                    routable
    timeout, error, wrong_output          eject
    overloaded                            de-weight (429, or a first token slower than the record allows)
    draining, old_generation              no new sessions; established ones finish

While the version roll waits to retire an instance, its probe also reads
`/metrics` for `vllm:num_requests_running` + `vllm:num_requests_waiting`
(vLLM's gauges, which the reference engine exports under the same names):
the roll retires it only when both are 0 (`Prober.in_flight`).

An engine that does not serve `/healthz/*` (stock vLLM) is probed on
`/health` for liveness and readiness, and `/healthz/generation` is skipped:
the canary then carries the whole output check, and the engine's identity
(instance, version = served model name, zone) is the agent's configuration.
`/health` says only that the process is up, and it answers late when the
engine is busy: the agent also reads each vLLM's `/metrics` every probe and
corrects the verdict by progress (warm_pool/progress.py: busy is
`overloaded`, a wedged engine core is `timeout`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Literal

import httpx
from httpx_sse import aconnect_sse
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from common.clock import Clock, SystemClock
from contract.canary import CanaryNotRecorded, CanaryRecord, record_from_completions, record_from_engine
from contract.identity import DRAINING_ERROR_TYPE, EngineIdentity

if TYPE_CHECKING:
    from warm_pool.progress import EngineMetrics


class Verdict(StrEnum):
    OK = "ok"
    TIMEOUT = "timeout"
    ERROR = "error"
    WRONG_OUTPUT = "wrong_output"
    OVERLOADED = "overloaded"
    DRAINING = "draining"
    OLD_GENERATION = "old_generation"


EJECT = frozenset({Verdict.TIMEOUT, Verdict.ERROR, Verdict.WRONG_OUTPUT})
NO_NEW_SESSIONS = frozenset({Verdict.DRAINING, Verdict.OLD_GENERATION})

Level = Literal["live", "ready", "generation", "canary"]


@dataclass(frozen=True)
class ProbeResult:
    verdict: Verdict
    level: Level
    reason: str
    identity: EngineIdentity | None = None
    ttft_s: float | None = None
    output_token_ids: tuple[int, ...] = field(default=())
    # `X-Lifeline-Generation` was on the `/healthz/generation` response: the engine holds its own lease and
    # stamps its frames with it (the gateway refuses frames of any other generation)
    stamps_generation: bool = False
    # it has no `/healthz/*` (stock vLLM): probed on `/health`, its identity is the agent's configuration
    stock_vllm: bool = False

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.OK


GENERATION_HEADER = "x-lifeline-generation"  # only an engine holding its own lease sends it
IN_FLIGHT_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
DEFAULT_TIMEOUT = httpx.Timeout(connect=1.0, read=5.0, write=2.0, pool=1.0)


def _status_verdict(response: httpx.Response, level: Level) -> ProbeResult | None:
    """None for a 2xx; otherwise the verdict its status and error body say."""
    if response.is_success:
        return None
    body = _json(response)
    error_type = str((body.get("error") or {}).get("type", "")) if isinstance(body.get("error"), dict) else ""
    status = str(body.get("engine_status", body.get("status", "")))
    if response.status_code == 429:
        return ProbeResult(Verdict.OVERLOADED, level, f"{level}: 429 {error_type or 'too many requests'}")
    if response.status_code == 503 and (error_type == DRAINING_ERROR_TYPE or status == "draining"):
        return ProbeResult(Verdict.DRAINING, level, f"{level}: 503 draining")
    return ProbeResult(Verdict.ERROR, level, f"{level}: HTTP {response.status_code} {error_type or status}".rstrip())


def _json(response: httpx.Response) -> dict:
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return body if isinstance(body, dict) else {}


def _transport_verdict(exc: httpx.TransportError, level: Level) -> ProbeResult:
    if isinstance(exc, httpx.TimeoutException):
        return ProbeResult(Verdict.TIMEOUT, level, f"{level}: {type(exc).__name__}")
    return ProbeResult(Verdict.ERROR, level, f"{level}: {type(exc).__name__}: {str(exc)[:200]}")


class Prober:
    """Probes one engine at a time over a shared client; never raises for what an engine does."""

    def __init__(self, client: httpx.AsyncClient, *, clock: Clock | None = None) -> None:
        self.client = client
        self.clock = clock or SystemClock()

    async def health(self, url: str, *, expected_versions: frozenset[str] | None = None,
                     expected_digests: dict[str, str] | None = None, stock_vllm: bool = False) -> ProbeResult:
        """live → ready → generation; the first level that fails gives the verdict.

        `expected_versions`: the versions the snapshot's aliases point to now
        (None: unknown, no generation check). `expected_digests`: version →
        the catalog's weights digest. `stock_vllm`: the engine answered 404 on
        `/healthz/live` before; go to `/health` at once (one GET, not two, on
        an engine whose API server is busy streaming).
        """
        identity = None
        try:
            live = None if stock_vllm else await self.client.get(f"{url}/healthz/live")
            if live is None or live.status_code == 404:  # stock vLLM: /health is liveness and readiness together
                health = await self.client.get(f"{url}/health")
                failed = _status_verdict(health, "live")
                if failed is not None:
                    return ProbeResult(failed.verdict, failed.level, failed.reason, stock_vllm=True)
                return ProbeResult(Verdict.OK, "live", "health: 200", stock_vllm=True)
            if failed := _status_verdict(live, "live"):
                return failed
            ready = await self.client.get(f"{url}/healthz/ready")
            if failed := _status_verdict(ready, "ready"):
                return failed
            generation = await self.client.get(f"{url}/healthz/generation")
            if failed := _status_verdict(generation, "generation"):
                return failed
        except httpx.TransportError as exc:
            return _transport_verdict(exc, "live")
        try:
            identity = EngineIdentity.model_validate_json(generation.content)
        except ValidationError as exc:
            return ProbeResult(Verdict.ERROR, "generation", f"generation: not an identity: {str(exc)[:200]}")
        stamps = GENERATION_HEADER in generation.headers
        if expected_versions is not None and identity.model not in expected_versions:
            return ProbeResult(Verdict.OLD_GENERATION, "generation",
                               f"serves {identity.model}; the snapshot's aliases name {sorted(expected_versions)}",
                               identity=identity, stamps_generation=stamps)
        digest = (expected_digests or {}).get(identity.model)
        if digest is not None and identity.weights_digest != digest:
            return ProbeResult(Verdict.WRONG_OUTPUT, "generation",
                               f"weights digest {identity.weights_digest[:19]}… is not the catalog's {digest[:19]}…",
                               identity=identity, stamps_generation=stamps)
        return ProbeResult(Verdict.OK, "generation", "live, ready, generation current", identity=identity,
                           stamps_generation=stamps)

    async def engine_metrics(self, url: str, *, timeout: float | None = None) -> EngineMetrics | None:
        """vLLM's work-held gauges and tokens counters (warm_pool/progress.py); None when it cannot say."""
        from warm_pool.progress import parse_engine_metrics

        try:
            response = await self.client.get(f"{url}/metrics",
                                              **({"timeout": httpx.Timeout(timeout)} if timeout is not None else {}))
        except httpx.TransportError:
            return None
        if not response.is_success:
            return None
        return parse_engine_metrics(response.text, read_at=self.clock.now())

    async def in_flight(self, url: str) -> int | None:
        """Requests running or waiting at the engine (its /metrics, summed over labels); None when it cannot say:
        no answer, not 2xx, unparsable, or either gauge absent (an unknown count is never taken for idle)."""
        try:
            response = await self.client.get(f"{url}/metrics")
            if not response.is_success:
                return None
            # only the two families' lines are parsed: vLLM's whole exposition (histograms per model) is far larger
            lines = "\n".join(line for line in response.text.splitlines() if any(g in line for g in IN_FLIGHT_GAUGES))
            found = {family.name: sum(sample.value for sample in family.samples)
                     for family in text_string_to_metric_families(lines + "\n") if family.name in IN_FLIGHT_GAUGES}
        except (httpx.TransportError, ValueError):
            return None
        if set(found) != set(IN_FLIGHT_GAUGES):
            return None
        return int(sum(found.values()))

    async def canary(self, url: str, *, model: str, record: CanaryRecord,
                     timeout: httpx.Timeout | None = None) -> ProbeResult:
        """Send the recorded prompt greedily and compare token count, time to first token and output.

        `timeout`: the stream's own (the agent's `canary_timeout`), longer than a health probe's: a busy
        engine's first token may come late, which is `overloaded`, not a timeout.
        """
        body = {"model": model, "prompt": record.prompt_token_ids, "max_tokens": record.max_tokens,
                "temperature": 0.0, "ignore_eos": True, "return_token_ids": True, "stream": True}
        started = self.clock.now()
        ttft = None
        tokens: list[int] = []
        try:
            async with aconnect_sse(self.client, "POST", f"{url}/v1/completions", json=body,
                                    **({"timeout": timeout} if timeout is not None else {})) as source:
                if not source.response.is_success:
                    await source.response.aread()
                    return _status_verdict(source.response, "canary") or ProbeResult(Verdict.ERROR, "canary", "?")
                async for event in source.aiter_sse():
                    if event.data == "[DONE]":
                        break
                    chunk = json.loads(event.data)
                    if "error" in chunk:
                        error_type = str((chunk["error"] or {}).get("type", ""))
                        verdict = Verdict.DRAINING if error_type == DRAINING_ERROR_TYPE else Verdict.ERROR
                        return ProbeResult(verdict, "canary", f"canary: stream ended with {error_type or 'an error'}",
                                           output_token_ids=tuple(tokens))
                    for choice in chunk.get("choices", []):
                        ids = choice.get("token_ids") or []
                        if ids and ttft is None:
                            ttft = self.clock.now() - started
                        tokens.extend(int(t) for t in ids)
        except httpx.TransportError as exc:
            result = _transport_verdict(exc, "canary")
            return ProbeResult(result.verdict, "canary", result.reason, ttft_s=ttft, output_token_ids=tuple(tokens))
        except (json.JSONDecodeError, TypeError, ValueError, AttributeError) as exc:
            return ProbeResult(Verdict.ERROR, "canary", f"canary: malformed stream: {str(exc)[:200]}",
                               output_token_ids=tuple(tokens))
        return judge_canary(record, tokens, ttft)


def judge_canary(record: CanaryRecord, tokens: list[int], ttft_s: float | None) -> ProbeResult:
    """The canary's verdict from what came back: count, then output, then time to first token."""
    got = tuple(tokens)
    expected = record.output_token_ids
    if len(got) != len(expected):
        return ProbeResult(Verdict.WRONG_OUTPUT, "canary", f"canary: {len(got)} tokens, recorded {len(expected)}",
                           ttft_s=ttft_s, output_token_ids=got)
    compared = record.compare_tokens or len(expected)
    for position, (have, want) in enumerate(zip(got[:compared], expected[:compared], strict=True)):
        if have != want:
            return ProbeResult(Verdict.WRONG_OUTPUT, "canary",
                               f"canary: token {position} is {have}, recorded {want}", ttft_s=ttft_s,
                               output_token_ids=got)
    if ttft_s is not None and ttft_s > record.max_ttft_s:
        return ProbeResult(Verdict.OVERLOADED, "canary",
                           f"canary: first token after {ttft_s:.3f} s, allowed {record.max_ttft_s:g} s",
                           ttft_s=ttft_s, output_token_ids=got)
    return ProbeResult(Verdict.OK, "canary", f"canary: {len(got)} tokens as recorded", ttft_s=ttft_s,
                       output_token_ids=got)


async def record_canary(url: str, prompt_token_ids: list[int], *, max_tokens: int, max_ttft_s: float,
                        compare_tokens: int | None = None, model: str | None = None) -> tuple[str, CanaryRecord]:
    """(version, record) from a verified engine's greedy output for `prompt_token_ids` (contract.canary).

    The reference engine says its version on `/healthz/generation`. Stock vLLM has none: the version is
    `model` (its served model name), else the one model its `/v1/models` lists, and the record is made
    through `/v1/completions` alone.
    """
    url = url.rstrip("/")
    async with httpx.AsyncClient(timeout=DEFAULT_TIMEOUT) as client:
        try:
            generation = await client.get(f"{url}/healthz/generation")
        except httpx.TransportError as exc:
            raise CanaryNotRecorded(f"{url}: {type(exc).__name__}: {str(exc)[:200]}") from None
        if generation.status_code != 404:
            source, record = await record_from_engine(client, url, prompt_token_ids, max_tokens=max_tokens,
                                                      max_ttft_s=max_ttft_s, compare_tokens=compare_tokens)
            return source.model, record
        version = model or await served_model(client, url)
        record = await record_from_completions(client, url, prompt_token_ids, model=version, max_tokens=max_tokens,
                                               max_ttft_s=max_ttft_s, compare_tokens=compare_tokens)
    return version, record


async def served_model(client: httpx.AsyncClient, url: str) -> str:
    """The one model an OpenAI server serves (`/v1/models`): for stock vLLM, its `--served-model-name`."""
    try:
        answer = await client.get(f"{url}/v1/models")
        names = [m["id"] for m in answer.raise_for_status().json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise CanaryNotRecorded(f"{url}/v1/models: no model list ({str(exc)[:200]}); name the served model") from None
    if len(names) != 1:
        raise CanaryNotRecorded(f"{url} serves {names}: name the served model (the version) to record")
    return str(names[0])
