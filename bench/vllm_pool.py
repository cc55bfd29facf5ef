"""vLLM's cold start and warm promotion beside the reference engine's, measured in one run by one method.

Cold start (each engine alone, one process at a time, median of `--cold` starts):

    /health          process start → `/health` answers 200 (vLLM: API server and engine core up; the
                     reference engine: weights loaded, self-test passed)
    first token      process start → the first streamed token of a 1-token `/v1/completions` sent once
                     `/health` said 200 (token-id prompt, `return_token_ids`)

Warm promotion (bench/pool.py's zone loss, with the same engine in both zones): the regional agent in
this process (real `local` driver, real Redis lease registry) keeps one instance serving in one zone
and one warm in the other; a gateway process routes alias `tiny` by the registry while a client sends
1-token streamed completions to it back to back. Each round SIGKILLs the serving instance's process
group (vLLM: API server and engine core) and records:

    detect           kill → the agent decides to promote the warm instance (`_promote` called; the
                     agent saw the process exit through the driver)
    lease            decision → the promoted instance holds a lease (for an instance never leased
                     before this includes the agent's first-lease check: two small completions)
    first token      decision → the first token of a request routed by the gateway (lease → the
                     gateway's registry view → the engine → the client)
    service RTO      kill → that first token
    backfill         kill → a new instance in the lost zone is warm (a cold start through the pool:
                     process, `/health`, the agent's admission)

The zones then swap roles (the backfilled zone keeps its instance warm), so a round starts one engine,
never two: at most two vLLM servers ever run, what this machine holds. vLLM is started by
`lifeline.vllm` (the pool's `pool_command()`, the production command line with Lifeline's logits
processor); the reference engine by `lifeline engine serve`, one torch thread each.

    .venv/bin/python -m bench.vllm_pool [--cold 3] [--rounds 3] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import tempfile
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import httpx

from bench.docs import replace_section
from bench.vllm_machine import RunRecord, begin_record, end_record, wait_for_vllm_room
from common.clock import SystemClock
from common import oneshot_http
from contract.lease import RedisLeaseRegistry
from lifeline.processes import EngineProcess, GatewayProcess, built_model, free_port, gateway_config
from lifeline.vllm import VllmProcess, pool_command, vllm_installed, vllm_python
from warm_pool.agent import Agent
from warm_pool.driver import LocalDriver
from warm_pool.events import EventShipper
from warm_pool.instance import Instance
from warm_pool.settings import AgentSettings, ZoneTarget
from warm_pool.states import InstanceState

REDIS_URL = "redis://127.0.0.1:6379/0"
REGION = "bench-vllm-pool"
ENGINES = ("reference", "vllm")
PROMPT_IDS = [11, 12, 13, 14, 15, 16]
HEADING = "## vLLM cold start and warm promotion beside the reference engine (bench/vllm_pool.py)"


# -- cold start ----------------------------------------------------------------------------------------

@dataclass
class ColdStart:
    health: float  # process start → /health 200
    first_token: float  # process start → the first streamed token


def first_token_s(url: str, model: str, *, timeout: float = 120.0) -> float:
    """Seconds from sending a 1-token streamed completion to its first token."""
    body = {"model": model, "prompt": PROMPT_IDS, "max_tokens": 1, "temperature": 0.0, "stream": True,
            "return_token_ids": True}
    sent = time.monotonic()
    with httpx.Client(timeout=timeout) as client, client.stream("POST", f"{url}/v1/completions", json=body) as answer:
        answer.raise_for_status()
        for line in answer.iter_lines():
            if line.startswith("data: {") and _has_token(json.loads(line[6:])):
                return time.monotonic() - sent
    raise RuntimeError(f"{url} streamed no token")


def _has_token(chunk: dict) -> bool:
    return any(choice.get("token_ids") or choice.get("text") for choice in chunk.get("choices") or [])


def _poll_health(url: str, alive: Callable[[], bool], what: str, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"{what} exited while starting")
        try:
            if oneshot_http.get(f"{url}/health", timeout=1.0).status_code == 200:
                return time.monotonic()
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{what}: no /health 200 within {timeout:.0f} s")


def cold_start(engine: str, model: Path, workdir: Path, index: int) -> ColdStart:
    port = free_port()
    if engine == "vllm":
        wait_for_vllm_room(1)
        server = VllmProcess(model=model, port=port, served_model_name=model.name,
                             log_path=workdir / f"cold-vllm-{index}.log")
        began = time.monotonic()
        server.start()
        try:
            healthy = _poll_health(server.url, server.alive, "vLLM", 300.0)
            token = first_token_s(server.url, model.name)
        finally:
            server.stop()
    else:
        process = EngineProcess(model, port, f"cold-{index}", workdir / f"cold-ref-{index}",
                                workdir / f"cold-ref-{index}.log")
        began = time.monotonic()
        process.start()
        try:
            healthy = _poll_health(process.url, lambda: process.process.poll() is None, "reference engine", 120.0)
            token = first_token_s(process.url, model.name)
        finally:
            process.kill()
    return ColdStart(healthy - began, healthy - began + token)


# -- warm promotion ----------------------------------------------------------------------------------

@dataclass
class Promotion:
    detect: float
    lease: float
    first_token: float
    service_rto: float
    backfill: float


@dataclass
class RoutedTokens:
    """1-token streamed completions sent to the gateway back to back; when each first token arrived."""

    url: str
    model: str
    stamps: list[float] = field(default_factory=list)
    failures: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        body = {"model": self.model, "prompt": PROMPT_IDS, "max_tokens": 1, "temperature": 0.0, "stream": True,
                "return_token_ids": True}
        async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as client:
            while not stop.is_set():
                try:
                    async with client.stream("POST", f"{self.url}/v1/completions", json=body) as answer:
                        if answer.status_code != 200:
                            await answer.aread()
                            raise httpx.HTTPStatusError("", request=answer.request, response=answer)
                        async for line in answer.aiter_lines():
                            if line.startswith("data: {") and _has_token(json.loads(line[6:])):
                                self.stamps.append(time.monotonic())
                                break
                    await asyncio.sleep(0.02)
                except (httpx.HTTPError, ValueError):
                    self.failures += 1
                    await asyncio.sleep(0.01)

    def first_after(self, moment: float) -> float | None:
        return next((stamp for stamp in self.stamps if stamp > moment), None)


class AgentStopped(RuntimeError):
    """The agent's tick loop ended while the bench waited on it: its exception is the cause."""


async def until(condition: Callable[[], Awaitable[object] | object], what: str, timeout: float,
                agent_ticks: asyncio.Task | None = None) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if agent_ticks is not None and agent_ticks.done():
            error = None if agent_ticks.cancelled() else agent_ticks.exception()
            raise AgentStopped(f"the agent stopped ticking while waiting for {what}: {error!r}") from error
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return time.monotonic()
        await asyncio.sleep(0.01)
    raise TimeoutError(f"never: {what} (within {timeout:.0f} s)")


@dataclass
class Promotions:
    rounds: list[Promotion] = field(default_factory=list)
    stopped: str | None = None  # why a round did not finish, if one did not


async def promotions(engine: str, model: Path, rounds: int, workdir: Path) -> Promotions:
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    region = f"{REGION}-{engine}"
    commands = {model.name: pool_command(shutdown_timeout=2.0, unroute_wait=0.5)} if engine == "vllm" else {}
    settings = AgentSettings(
        region=region, registry=REDIS_URL, registry_prefix=prefix, lease_ttl=timedelta(seconds=2),
        probe_interval=timedelta(seconds=0.25), probe_timeout=timedelta(seconds=1.5),
        pool={"model": "tiny", "versions": {model.name: str(model)}, "state_dir": str(workdir / f"pool-{engine}"),
              "start_timeout": 300, "commands": commands,
              "zones": {"z1": {"serving": 1, "warm": 0}, "z2": {"serving": 0, "warm": 1}}})
    gateway = GatewayProcess(gateway_config(model, region=region, registry={
        "kind": "redis", "url": REDIS_URL, "key_prefix": prefix, "refresh_interval": 0.1, "ttl": 2.0}),
        free_port(), workdir / f"gateway-{engine}")
    registry = RedisLeaseRegistry.from_url(REDIS_URL, region=region, prefix=prefix, ttl=settings.lease_ttl)
    assert settings.pool is not None and settings.pool.state_dir is not None  # noqa: S101 - set just above
    driver = LocalDriver(region=region, versions=settings.pool.versions, state_dir=settings.pool.state_dir,
                         commands=settings.pool.commands)
    http = httpx.AsyncClient(timeout=httpx.Timeout(2.0))
    agent = Agent(settings, registry=registry, http=http, clock=SystemClock(), driver=driver,
                  shipper=EventShipper(None, None))
    decisions: list[tuple[str, float]] = []  # (instance id, when `_promote` was called)
    promote = agent.reconciler._promote

    async def stamped(instance: Instance, for_zone: str) -> bool:
        decisions.append((instance.instance_id, time.monotonic()))
        return await promote(instance, for_zone)

    agent.reconciler._promote = stamped  # type: ignore[method-assign]
    stop, stop_client = asyncio.Event(), asyncio.Event()
    client = RoutedTokens(gateway.url, "tiny")
    results = Promotions()

    def in_zone(zone: str, state: InstanceState) -> list[Instance]:
        return [i for i in agent.instances.values() if i.zone == zone and i.state is state]

    async def leased(instance_id: str) -> bool:
        return instance_id in {lease.instance_id for lease in await registry.live()}

    if engine == "vllm":
        wait_for_vllm_room(2)
    gateway.start()
    ticking = asyncio.create_task(agent.run_ticks(stop))
    traffic: asyncio.Task | None = None
    serving_zone, warm_zone = "z1", "z2"
    try:
        await asyncio.to_thread(gateway.wait_live)
        traffic = asyncio.create_task(client.run(stop_client))
        try:
            for _ in range(rounds):
                await until(lambda: len(in_zone(serving_zone, InstanceState.SERVING)) == 1
                            and [i for i in in_zone(warm_zone, InstanceState.WARM) if agent.admitted(i)],
                            f"one serving in {serving_zone}, one warm in {warm_zone}", 600, ticking)
                victim = in_zone(serving_zone, InstanceState.SERVING)[0]
                standby = in_zone(warm_zone, InstanceState.WARM)[0]
                await until(lambda: client.first_after(time.monotonic() - 0.5), "the gateway answering", 120, ticking)
                pid = driver.pid(victim.instance_id)
                assert pid is not None  # noqa: S101 - the driver started it
                killed = time.monotonic()
                os.killpg(pid, signal.SIGKILL)  # its session: vLLM's engine core goes with its API server
                await until(lambda: any(d[0] == standby.instance_id and d[1] > killed for d in decisions),
                            "the promotion decision", 60, ticking)
                decided = next(d[1] for d in decisions if d[0] == standby.instance_id and d[1] > killed)
                lease = await until(lambda: leased(standby.instance_id), "the promoted instance leased", 60, ticking)
                token = await until(lambda: client.first_after(decided), "a routed token after the promotion", 60, ticking)
                token = client.first_after(decided) or token
                # the lost zone keeps its backfill warm; the promoted zone serves (no rebalance, no second start)
                assert settings.pool is not None  # noqa: S101
                settings.pool.zones[serving_zone] = ZoneTarget(serving=0, warm=1)
                settings.pool.zones[warm_zone] = ZoneTarget(serving=1, warm=0)
                backfilled = await until(lambda: [i for i in in_zone(serving_zone, InstanceState.WARM)
                                                  if i.instance_id != victim.instance_id and agent.admitted(i)],
                                         f"a warm backfill in {serving_zone}", 600, ticking)
                results.rounds.append(Promotion(decided - killed, lease - decided, token - decided, token - killed,
                                         backfilled - killed))
                print(f"  {engine} promotion: " + ", ".join(f"{k} {v * 1000:.0f} ms"
                                                            for k, v in vars(results.rounds[-1]).items()), flush=True)
                serving_zone, warm_zone = warm_zone, serving_zone
        except (TimeoutError, AgentStopped) as exc:  # keep the rounds that finished; the table says why
            results.stopped = f"round {len(results.rounds) + 1}: {exc}"
            print(f"  {engine} promotion stopped: {results.stopped}", flush=True)
            if isinstance(exc, AgentStopped) and exc.__cause__ is not None:
                traceback.print_exception(exc.__cause__)
    finally:
        stop_client.set()
        stop.set()
        for task in (traffic, ticking):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (traffic, ticking) if t is not None), return_exceptions=True)
        await agent.close()
        await registry.close()
        await http.aclose()
        gateway.kill()
    return results


# -- the table ---------------------------------------------------------------------------------------

def _ms(values: list[float]) -> str:
    if not values:
        return "—"
    median = statistics.median(values) * 1000
    return f"{median:,.0f} [{min(values) * 1000:,.0f}–{max(values) * 1000:,.0f}]"


def _ratio(vllm: list[float], reference: list[float]) -> str:
    if not vllm or not reference or statistics.median(reference) == 0:
        return "—"
    return f"{statistics.median(vllm) / statistics.median(reference):.1f}×"


def render(cold: dict[str, list[ColdStart]], promoted: dict[str, Promotions], record: RunRecord,
           *, cold_runs: int, rounds: int) -> str:
    rows: list[tuple[str, list[float], list[float]]] = [
        ("cold start: process start → `/health` 200", *[[c.health for c in cold[e]] for e in ENGINES]),
        ("cold start: process start → first token", *[[c.first_token for c in cold[e]] for e in ENGINES]),
    ]
    labels = {"detect": "warm promotion: kill → promotion decision",
              "lease": "warm promotion: decision → lease held",
              "first_token": "**warm promotion: decision → first routed token**",
              "service_rto": "warm promotion: kill → first routed token (service RTO)",
              "backfill": "backfill through the pool: kill → a new instance warm"}
    for name, label in labels.items():
        rows.append((label, *[[getattr(p, name) for p in promoted[e].rounds] for e in ENGINES]))
    lines = [record.line() + ".", "",
             f"Cold starts: {cold_runs} per engine, alternating reference / vLLM, one process at a time. Warm "
             f"promotion: {rounds} rounds per engine (bench/pool.py's zone loss: the serving instance's process "
             "group SIGKILLed, the other zone's warm instance promoted; the zones then swap roles), one gateway "
             "process (Redis registry, refresh 100 ms), agent probe interval 250 ms, probe timeout 1.5 s, lease "
             "TTL 2 s, a client sending 1-token streamed completions through the gateway back to back (20 ms "
             "apart). `tiny` model (the tests' tiny-seed0); vLLM float32 with `--enforce-eager` and Lifeline's "
             "logits processor (`lifeline.vllm.pool_command`), the reference engine float64 with one torch "
             "thread. Median [min–max] in ms.", "",
             "| measure | reference engine | vLLM | vLLM / reference |", "|---|---:|---:|---:|"]
    for label, reference, vllm in rows:
        lines.append(f"| {label} | {_ms(reference)} | {_ms(vllm)} | {_ratio(vllm, reference)} |")
    for engine in ENGINES:
        if promoted[engine].stopped:
            lines += ["", f"{engine}: {len(promoted[engine].rounds)} of {rounds} promotion rounds finished; "
                          f"stopped at {promoted[engine].stopped}"]
    return "\n".join(lines)


async def _promotions_all(engines: list[str], model: Path, rounds: int, workdir: Path) -> dict[str, Promotions]:
    done = {engine: Promotions() for engine in ENGINES}
    for engine in engines:
        done[engine] = await promotions(engine, model, rounds, workdir)
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", type=int, default=3, help="cold starts per engine (the median is reported)")
    parser.add_argument("--rounds", type=int, default=3, help="warm promotions per engine")
    parser.add_argument("--engines", default=",".join(ENGINES), help="a subset, for a smoke run (then do not --write)")
    parser.add_argument("--write", type=Path, default=None, help="replace this bench's section of docs/benchmarks.md")
    args = parser.parse_args()
    engines = [e for e in args.engines.split(",") if e]
    if unknown := set(engines) - set(ENGINES):
        parser.error(f"--engines: unknown {sorted(unknown)}; known: {', '.join(ENGINES)}")
    if "vllm" in engines and not vllm_installed():
        raise SystemExit(f"no vLLM interpreter at {vllm_python()}: run `make vllm` first")
    record = begin_record()
    model = built_model("tiny", 0)
    cold: dict[str, list[ColdStart]] = {engine: [] for engine in ENGINES}
    with tempfile.TemporaryDirectory(prefix="bench-vllm-pool-") as tmp:
        workdir = Path(tmp)
        for index in range(args.cold):
            for engine in engines:
                cold[engine].append(cold_start(engine, model, workdir, index))
                print(f"  {engine} cold start {index}: /health {cold[engine][-1].health:.2f} s, first token "
                      f"{cold[engine][-1].first_token:.2f} s", flush=True)
        promoted = asyncio.run(_promotions_all(engines, model, args.rounds, workdir))
    table = render(cold, promoted, end_record(record), cold_runs=args.cold, rounds=args.rounds)
    print(table)
    if args.write:
        replace_section(args.write, HEADING, table)


if __name__ == "__main__":
    main()
