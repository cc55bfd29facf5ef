"""Thousands of simulated engines in one process: the engine surface Lifeline uses, real; the model, simulated.

Each engine is reached at `http://HOST:PORT/e/<instance_id>` (the gateway's
engine client and the agent's probes keep a base URL's path) and answers what
the reference engine answers there, built by the same functions
(`contract.openai`, `engine.sse`, `contract.identity`, prometheus_client):

    GET  /health, /healthz/live, /healthz/ready, /healthz/generation    the probes' and identity's bodies
    GET  /v1/models, /metrics (vLLM's in-flight gauges and token counters)
    POST /v1/completions   token-id prompts, `return_token_ids`, streamed (SSE) or whole, `X-Lifeline-Generation`

What is simulated, and only that: the model. Output token `i` is a hash of
(version, prompt ids, i) modulo the vocabulary — deterministic and greedy-like
(the same prompt on the same version always gives the same tokens; two
versions differ), computed in microseconds, never a forward pass.

What is real: each engine holds a lease in the region's Redis registry
through `contract.lease`'s own scripts and key layout (registered one by one
with `RedisLeaseRegistry.register`, renewed in pipelines of the real
`RENEW_SCRIPT` twice a TTL, registered again when one lapsed), so
gateways and the control plane see
exactly what real engines would write. `POST /admin/regions/<region>/lose`
stops a region's renewals and makes its engines answer 503: its leases
lapse together, as in a region loss.

One port for all engines because a port range of 10,000 listeners would cost
file descriptors and accept loops for nothing the gateway can tell apart.
Served by Starlette on uvicorn: both already run every Lifeline process, so
the simulator adds no server library.

    .venv/bin/python -m bench.fleet_sim --port 9100 --engines 1000 --key-prefix fleet --versions v0=sha256:…,v1=sha256:…
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import redis.asyncio as aioredis
import uvicorn
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from common.errors import error_body
from common.logs import get_logger
from contract.identity import EngineIdentity
from contract.lease import RENEW_SCRIPT, LeaseKeys, RedisLeaseRegistry, Registration
from contract.openai import completion_body, model_card, model_list, usage
from contract.sampling import Sampling
from engine.sse import DONE, sse_data

VOCAB_SIZE = 4096  # the tiny preset's: the gateway detokenizes every id with the version's tokenizer
EOS_TOKEN_ID = 1
MAX_MODEL_LEN = 4096
DEFAULT_MAX_TOKENS = 16
RENEWALS_PER_TTL = 2  # the reference engine renews at a third of a TTL; one process renewing 10,000 keeps up at half

log = get_logger(__name__)


def simulated_tokens(version: str, prompt_ids: list[int], count: int) -> list[int]:
    """The simulated model: `count` output ids for `prompt_ids` on `version`, the same every time, never EOS."""
    seed = zlib.crc32(f"{version}:{','.join(map(str, prompt_ids))}".encode())
    out = []
    for i in range(count):
        token = zlib.crc32(i.to_bytes(4, "little"), seed) % VOCAB_SIZE
        out.append(token + 2 if token <= EOS_TOKEN_ID else token)  # ids 0 and 1 are BOS and EOS
    return out


@dataclass
class SimulatedEngine:
    """One engine's identity and counters; its lease generation is the registry's."""

    instance_id: str
    version: str
    region: str
    zone: str
    url: str
    weights_digest: str  # the catalog's digest of the version: the agent checks identity by it
    started_at: float = field(default_factory=time.time)
    generation: int = 0
    running: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    lost: bool = False

    def identity(self) -> EngineIdentity:
        return EngineIdentity(instance_id=self.instance_id, generation=self.generation, boot_generation=1,
                              model=self.version, weights_digest=self.weights_digest, zone=self.zone,
                              region=self.region, started_at=self.started_at)

    def registration(self) -> Registration:
        return Registration(instance_id=self.instance_id, url=self.url, version=self.version, zone=self.zone,
                            region=self.region, sampling=Sampling.ENGINE_DEFAULT.value)




class _EngineMetrics:
    """One engine's `/metrics` families under vLLM's names, for prometheus_client to render."""

    def __init__(self, engine: SimulatedEngine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield GaugeMetricFamily("vllm:num_requests_running", "Sequences being decoded", value=self.engine.running)
        yield GaugeMetricFamily("vllm:num_requests_waiting", "Sequences waiting for a decode slot", value=0)
        yield CounterMetricFamily("vllm:generation_tokens", "Generated tokens", value=self.engine.generation_tokens)
        yield CounterMetricFamily("vllm:prompt_tokens", "Prefilled prompt tokens", value=self.engine.prompt_tokens)


@dataclass
class SimulatedFleet:
    """Every simulated engine of this process, by instance id, and their leases in the regions' registries."""

    engines: dict[str, SimulatedEngine]
    redis: aioredis.Redis
    key_prefix: str
    ttl: timedelta
    probes_served: int = 0  # health, identity and metrics answers: what a regional agent's probing costs the fleet

    @classmethod
    def spread(cls, count: int, *, base_url: str, regions: list[str], zones: list[str], versions: dict[str, str],
               redis: aioredis.Redis, key_prefix: str, ttl: timedelta) -> SimulatedFleet:
        """`count` engines dealt round-robin over regions, then zones, then `versions` (version → weights digest)."""
        names = sorted(versions)
        engines = {}
        for n in range(count):
            region = regions[n % len(regions)]
            zone = f"{region}-{zones[(n // len(regions)) % len(zones)]}"
            version = names[(n // (len(regions) * len(zones))) % len(names)]
            instance_id = f"sim-{region}-{n:05d}"
            engines[instance_id] = SimulatedEngine(instance_id, version, region, zone, f"{base_url}/e/{instance_id}",
                                                   versions[version])
        return cls(engines, redis, key_prefix, ttl)

    async def keep_leases(self, *, registrations_per_round: int = 200) -> None:
        """Hold every live engine's lease, as each engine would: renew it twice a TTL, register it again
        when it lapsed or was never registered.

        One round: up to `registrations_per_round` registrations through the registry's own script (100 at a
        time, within the Redis client's pool: redis-py refuses past it rather than queue), then one pipeline of
        the real renewal script for every other engine. Registrations are spread over rounds so that the
        renewals of the engines already registered never wait behind a whole fleet's start-up.
        """
        registries = {region: RedisLeaseRegistry(self.redis, region=region, prefix=self.key_prefix, ttl=self.ttl)
                      for region in {e.region for e in self.engines.values()}}
        ttl_ms = max(1, int(self.ttl.total_seconds() * 1000))
        lease_keys = {}
        for engine in self.engines.values():
            keys = LeaseKeys(engine.region, self.key_prefix)
            lease_keys[engine.instance_id] = (keys.generation(engine.instance_id), keys.lease(engine.instance_id),
                                              keys.index)
        while True:
            started = time.monotonic()
            live = [e for e in self.engines.values() if not e.lost]
            unregistered = [e for e in live if not e.generation][:registrations_per_round]
            for batch in range(0, len(unregistered), 100):
                chunk = unregistered[batch:batch + 100]
                leases = await asyncio.gather(*(registries[e.region].register(e.registration()) for e in chunk))
                for engine, lease in zip(chunk, leases, strict=True):
                    engine.generation = lease.generation
            held = [e for e in live if e.generation and e not in unregistered]
            sha = await self.redis.script_load(RENEW_SCRIPT)  # then each renewal is a bare EVALSHA of the real script
            async with self.redis.pipeline(transaction=False) as pipe:
                for engine in held:
                    pipe.execute_command("EVALSHA", sha, 3, *lease_keys[engine.instance_id],
                                         engine.generation, ttl_ms, engine.instance_id)
                answers = await pipe.execute()
            for engine, (code, _, _) in zip(held, answers, strict=True):
                if int(code) < 0:  # lapsed or superseded: register again, under a new generation
                    engine.generation = 0
            took = time.monotonic() - started
            if took > self.ttl.total_seconds() / RENEWALS_PER_TTL:
                log.warning("lease round overran", seconds=round(took, 3), held=len(held),
                            registered=len(unregistered))
            await asyncio.sleep(max(0.0, self.ttl.total_seconds() / RENEWALS_PER_TTL - took))

    def lose_region(self, region: str) -> int:
        """Stop renewing the region's leases and fail its engines' answers; how many engines that was."""
        lost = [e for e in self.engines.values() if e.region == region]
        for engine in lost:
            engine.lost = True
        return len(lost)


# -- the engine surface -------------------------------------------------------------------------------------------

def _engine(request: Request, *, probe: bool = True) -> SimulatedEngine | Response:
    fleet: SimulatedFleet = request.app.state.fleet
    fleet.probes_served += probe
    engine = fleet.engines.get(request.path_params["instance"])
    if engine is None:
        return JSONResponse(error_body("not_found", "no such simulated engine", code=404), status_code=404)
    if engine.lost:
        return JSONResponse(error_body("engine_unavailable", "the region is lost", code=503), status_code=503)
    return engine


async def health(request: Request) -> Response:
    engine = _engine(request)
    return engine if isinstance(engine, Response) else Response(status_code=200)


async def live(request: Request) -> Response:
    engine = _engine(request)
    # step_age_s: no decode step under way, as an idle reference engine says
    return engine if isinstance(engine, Response) else JSONResponse(
        {"status": "live", "step_age_s": None, "step_stall_bound_s": 5.0})


async def ready(request: Request) -> Response:
    engine = _engine(request)
    return engine if isinstance(engine, Response) else JSONResponse({"status": "ready", "engine_status": "ready"})


async def generation(request: Request) -> Response:
    engine = _engine(request)
    return engine if isinstance(engine, Response) else JSONResponse(engine.identity().model_dump(mode="json"))


async def models(request: Request) -> Response:
    engine = _engine(request)
    if isinstance(engine, Response):
        return engine
    return JSONResponse(model_list([model_card(engine.version, root=f"simulated:{engine.version}",
                                               max_model_len=MAX_MODEL_LEN, owned_by="lifeline")]))


async def metrics(request: Request) -> Response:
    engine = _engine(request)
    if isinstance(engine, Response):
        return engine
    return Response(generate_latest(_EngineMetrics(engine)), media_type="text/plain; version=0.0.4; charset=utf-8")


async def completions(request: Request) -> Response:
    engine = _engine(request, probe=False)
    if isinstance(engine, Response):
        return engine
    body = await request.json()
    prompt = body.get("prompt")
    if not (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
        return JSONResponse(error_body("invalid_request_error", "the simulated engine takes token-id prompts",
                                       param="prompt", code=400), status_code=400)
    count = int(body.get("max_tokens") or DEFAULT_MAX_TOKENS)
    tokens = simulated_tokens(engine.version, prompt, count)
    engine.prompt_tokens += len(prompt)
    engine.generation_tokens += count
    request_id = request.headers.get("x-request-id") or f"cmpl-{uuid.uuid4().hex}"
    headers = {"X-Lifeline-Instance": engine.instance_id, "X-Lifeline-Generation": str(engine.generation)}
    with_ids = bool(body.get("return_token_ids"))
    if not body.get("stream"):
        whole = completion_body(kind="completion", request_id=request_id, created=int(time.time()),
                                model=engine.version, text="", finish_reason="length",
                                token_ids=tokens if with_ids else None, usage_=usage(len(prompt), count, cached_tokens=0))
        if with_ids:
            whole["prompt_token_ids"] = whole["choices"][0]["prompt_token_ids"] = prompt
        return JSONResponse(whole, headers=headers)
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    stream = _stream(engine, request_id, prompt, tokens, with_ids=with_ids, include_usage=include_usage)
    return StreamingResponse(stream, media_type="text/event-stream", headers=headers)


async def _stream(engine: SimulatedEngine, request_id: str, prompt: list[int], tokens: list[int], *,
                  with_ids: bool, include_usage: bool) -> AsyncIterator[str]:
    """One chunk per token, as the reference engine writes them (text left empty: the gateway decodes the ids)."""
    created = int(time.time())
    engine.running += 1
    try:
        for i, token in enumerate(tokens):
            choice: dict[str, Any] = {"index": 0, "text": "", "logprobs": None,
                                      "finish_reason": "length" if i == len(tokens) - 1 else None}
            chunk: dict[str, Any] = {"id": request_id, "object": "text_completion", "created": created,
                                     "model": engine.version, "choices": [choice]}
            if with_ids:
                choice["token_ids"] = [token]
                if i == 0:  # the prompt's ids ride on the first chunk, as vLLM sends them
                    chunk["prompt_token_ids"] = choice["prompt_token_ids"] = prompt
            yield sse_data(chunk)
            await asyncio.sleep(0)
        if include_usage:
            yield sse_data({"id": request_id, "object": "text_completion", "created": created, "model": engine.version,
                            "choices": [], "usage": usage(len(prompt), len(tokens), cached_tokens=0)})
        yield DONE
    finally:
        engine.running -= 1


async def lose_region(request: Request) -> Response:
    fleet: SimulatedFleet = request.app.state.fleet
    return JSONResponse({"region": request.path_params["region"],
                         "engines": fleet.lose_region(request.path_params["region"]), "at": time.time()})


async def fleet_status(request: Request) -> Response:
    fleet: SimulatedFleet = request.app.state.fleet
    return JSONResponse({"engines": len(fleet.engines),
                         "registered": sum(1 for e in fleet.engines.values() if e.generation),
                         "lost": sum(1 for e in fleet.engines.values() if e.lost),
                         "probes_served": fleet.probes_served})


def create_app(fleet: SimulatedFleet, *, renew: bool = True) -> Starlette:
    """The fleet's one app; with `renew`, engines hold leases from start-up to shutdown (`/admin/fleet` counts
    the registered)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app.state.fleet = fleet
        renewals = None
        if renew:
            renewals = asyncio.create_task(fleet.keep_leases(), name="leases")
        try:
            yield
        finally:
            if renewals is not None:
                renewals.cancel()

    prefix = "/e/{instance}"
    return Starlette(lifespan=lifespan, routes=[
        Route(f"{prefix}/health", health),
        Route(f"{prefix}/healthz/live", live),
        Route(f"{prefix}/healthz/ready", ready),
        Route(f"{prefix}/healthz/generation", generation),
        Route(f"{prefix}/v1/models", models),
        Route(f"{prefix}/metrics", metrics),
        Route(f"{prefix}/v1/completions", completions, methods=["POST"]),
        Route("/admin/regions/{region}/lose", lose_region, methods=["POST"]),
        Route("/admin/fleet", fleet_status),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--engines", type=int, required=True)
    parser.add_argument("--regions", default="r1,r2,r3")
    parser.add_argument("--zones", default="a,b,c")
    parser.add_argument("--versions", required=True,
                        help="version=weights_digest,…: the digests the catalog recorded (`contract.identity`)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--key-prefix", required=True)
    parser.add_argument("--ttl", type=float, default=2.0, help="lease TTL in seconds")
    args = parser.parse_args()
    fleet = SimulatedFleet.spread(args.engines, base_url=f"http://127.0.0.1:{args.port}",
                                  regions=args.regions.split(","), zones=args.zones.split(","),
                                  versions=dict(v.split("=", 1) for v in args.versions.split(",")), redis=aioredis.Redis.from_url(args.redis_url),
                                  key_prefix=args.key_prefix, ttl=timedelta(seconds=args.ttl))
    uvicorn.run(create_app(fleet), host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
