"""Warm promotion and zone-loss recovery: SIGKILL the serving instance, time what the gateway sees.

One gateway process routes alias `tiny` by the Redis lease registry; the
regional agent (in this process, real `local` driver) keeps one serving
instance in z1 and one warm in z2 (the plan for one instance of demand over
two zones). Each round kills z1's serving instance (the whole zone's
serving capacity) with SIGKILL while a client sends greedy 1-token
completions to the gateway back to back, and records:

    detect          kill → the victim's lease is gone (the agent saw the exit and released it)
    promote         kill → the warm instance holds a lease (registered by the agent)
    time-to-effect  promotion → the first completion the gateway answers (lease → gateway → engine)
    service RTO     kill → the first completion answered after the kill failed (fault → new requests succeed)
    backfill        kill → a new instance in z1 is warm again (a cold start: load + admission); the agent
                    then gives z1 its serving share back and demotes z2's instance, before the next round

A second part flips alias `prod` between two versions of a one-zone pool
that keeps one warm instance on the previous version (`warm_previous: 1`),
with the agent alone (the gateway's share is time-to-effect above):

    new version     alias moved to a version nothing runs → it holds a lease (a cold start)
    rollback        alias moved back to the previous version → its warm instance holds a lease (blue/green)

    .venv/bin/python -m bench.pool [--rounds 5] [--rollbacks 6] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from bench.docs import replace_section
from common.clock import SystemClock
from contract.lease import RedisLeaseRegistry
from contract.snapshot import RoutingSnapshot
from lifeline.processes import GatewayProcess, built_model, free_port, gateway_config
from warm_pool.agent import Agent
from warm_pool.driver import LocalDriver
from warm_pool.events import EventShipper
from warm_pool.settings import AgentSettings
from warm_pool.states import InstanceState

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = "redis://127.0.0.1:6379/0"
REGION = "bench-pool"
BODY = {"model": "tiny", "prompt": "The warm pool took over", "max_tokens": 1, "temperature": 0.0}


async def wait(condition, timeout: float = 120.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await condition():
            return time.monotonic()
        await asyncio.sleep(0.01)
    raise TimeoutError("condition never held")


async def run(rounds: int, workdir: Path) -> dict[str, list[float]]:
    model = built_model("tiny", 0)
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    settings = AgentSettings(
        region=REGION, registry=REDIS_URL, registry_prefix=prefix, lease_ttl=2.0, probe_interval=0.25,
        probe_timeout=1.0, pool={"model": "tiny", "versions": {model.name: str(model)}, "state_dir": str(workdir / "pool"),
                                 "zones": {"z1": {"serving": 1, "warm": 0}, "z2": {"serving": 0, "warm": 1}}})
    gateway = GatewayProcess(gateway_config(model, region=REGION, registry={
        "kind": "redis", "url": REDIS_URL, "key_prefix": prefix, "refresh_interval": 0.1}), free_port(), workdir)
    gateway.start()
    gateway.wait_live()
    registry = RedisLeaseRegistry.from_url(REDIS_URL, region=REGION, prefix=prefix, ttl=settings.lease_ttl)
    driver = LocalDriver(region=REGION, versions=settings.pool.versions, state_dir=settings.pool.state_dir)
    shipper = EventShipper(None, None)
    http = httpx.AsyncClient(timeout=httpx.Timeout(1.0))
    agent = Agent(settings, registry=registry, http=http, clock=SystemClock(), driver=driver, shipper=shipper)
    client = httpx.AsyncClient(timeout=httpx.Timeout(5.0))
    results: dict[str, list[float]] = {k: [] for k in ("detect", "promote", "time-to-effect", "service RTO", "backfill")}

    stop = asyncio.Event()

    def zone_state(zone: str, state: InstanceState) -> list[str]:
        return [i.instance_id for i in agent.instances.values() if i.zone == zone and i.state is state]

    async def answered() -> bool:
        try:
            return (await client.post(f"{gateway.url}/v1/completions", json=BODY)).status_code == 200
        except httpx.TransportError:
            return False

    ticking = asyncio.create_task(agent.run_ticks(stop))
    try:
        for _ in range(rounds):
            async def ready() -> bool:  # the plan's layout (after a round: backfilled and rebalanced)
                return len(zone_state("z1", InstanceState.SERVING)) == 1 and len(zone_state("z2", InstanceState.WARM)) == 1
            await wait(ready)
            await wait(answered)
            serving = agent.instances[zone_state("z1", InstanceState.SERVING)[0]]
            standby = agent.instances[zone_state("z2", InstanceState.WARM)[0]]
            killed_at = time.monotonic()
            os.kill(driver.pid(serving.instance_id), signal.SIGKILL)

            async def unleased() -> bool:
                return serving.instance_id not in {lease.instance_id for lease in await registry.live()}

            async def promoted() -> bool:
                return standby.instance_id in {lease.instance_id for lease in await registry.live()}

            detect, promote = await asyncio.gather(wait(unleased), wait(promoted))
            effect = await wait(answered)
            backfilled = await wait(lambda: _true(  # warm, and at once serving again (rebalanced in the same tick)
                set(zone_state("z1", InstanceState.WARM) + zone_state("z1", InstanceState.SERVING))
                - {serving.instance_id}))
            results["detect"].append(detect - killed_at)
            results["promote"].append(promote - killed_at)
            results["time-to-effect"].append(effect - promote)
            results["service RTO"].append(effect - killed_at)
            results["backfill"].append(backfilled - killed_at)
    finally:
        stop.set()
        ticking.cancel()
        await asyncio.gather(ticking, return_exceptions=True)
        await agent.close()
        await registry.close()
        await http.aclose()
        await client.aclose()
        gateway.kill()
    return results


def _snapshot(version: str, revision: int) -> RoutingSnapshot:
    return RoutingSnapshot.model_validate({"version": revision, "models": {"tiny": {
        "aliases": {"prod": {"version": version, "revision": revision}},
        "versions": {v: {"version": v, "fingerprint": "f", "location": "/x"} for v in ("v1", "v2")}}}})


class _Snapshots:
    current: RoutingSnapshot | None = None


async def run_rollbacks(flips: int, workdir: Path) -> dict[str, list[float]]:
    """Alias moves between v1 and v2 (same weights, two served names): the first a cold start, then rollbacks."""
    model = built_model("tiny", 0)
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    settings = AgentSettings(
        region=f"{REGION}-roll", registry=REDIS_URL, registry_prefix=prefix, lease_ttl=2.0, probe_interval=0.25,
        probe_timeout=1.0, pool={"model": "tiny", "versions": {"v1": str(model), "v2": str(model)},
                                 "state_dir": str(workdir / "roll"), "old_generation_grace": 0.5,
                                 "zones": {"z1": {"serving": 1, "warm": 0, "warm_previous": 1}}})
    registry = RedisLeaseRegistry.from_url(REDIS_URL, region=settings.region, prefix=prefix, ttl=settings.lease_ttl)
    driver = LocalDriver(region=settings.region, versions=settings.pool.versions, state_dir=settings.pool.state_dir)
    http = httpx.AsyncClient(timeout=httpx.Timeout(1.0))
    agent = Agent(settings, registry=registry, http=http, clock=SystemClock(), driver=driver,
                  shipper=EventShipper(None, None))
    agent.snapshots = snapshots = _Snapshots()  # type: ignore[assignment]
    snapshots.current = _snapshot("v1", 1)
    results: dict[str, list[float]] = {"new version (cold start)": [], "rollback to the warm previous": []}

    stop = asyncio.Event()

    def only_lease(version: str):
        async def check() -> bool:
            return [lease.version for lease in await registry.live()] == [version]
        return check

    async def settled(version: str, other: str) -> bool:  # serving the alias' version, the other one warm
        states = [(i.version, i.state) for i in agent.instances.values()]
        return sorted(states) == sorted([(version, InstanceState.SERVING), (other, InstanceState.WARM)]) \
            and await only_lease(version)()

    ticking = asyncio.create_task(agent.run_ticks(stop))
    try:
        await wait(only_lease("v1"))
        current, other = "v1", "v2"
        for flip in range(flips + 1):
            current, other = other, current
            moved_at = time.monotonic()
            snapshots.current = _snapshot(current, flip + 2)
            leased = await wait(lambda: _lease_of(registry, current))
            results["new version (cold start)" if flip == 0 else "rollback to the warm previous"].append(
                leased - moved_at)
            await wait(lambda: settled(current, other))
    finally:
        stop.set()
        ticking.cancel()
        await asyncio.gather(ticking, return_exceptions=True)
        await agent.close()
        await registry.close()
        await http.aclose()
    return results


async def _lease_of(registry: RedisLeaseRegistry, version: str) -> bool:
    return version in {lease.version for lease in await registry.live()}


async def _true(value: object) -> bool:
    return bool(value)


def table(results: dict[str, list[float]]) -> str:
    lines = ["| measure | rounds | p50 ms | max ms |", "|---|---:|---:|---:|"]
    for name, values in results.items():
        lines.append(f"| {name} | {len(values)} | {statistics.median(values) * 1000:.0f} | {max(values) * 1000:.0f} |")
    return "\n".join(lines)


async def _both(rounds: int, flips: int, workdir: Path) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    results = await run(rounds, workdir) if rounds else {}
    return results, (await run_rollbacks(flips, workdir) if flips else {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rollbacks", type=int, default=6, help="alias flips back to the warm previous version")
    parser.add_argument("--write", type=Path, default=None, help="replace this section of docs/benchmarks.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-pool-") as tmp:
        results, rollbacks = asyncio.run(_both(args.rounds, args.rollbacks, Path(tmp)))
    body = (f"{args.rounds} rounds, 1 gateway process (Redis registry, refresh 100 ms), agent probe interval 250 ms, "
            f"lease TTL 2 s, tiny reference engines, {platform.machine()}, Python {platform.python_version()}, on a "
            "shared 2-core machine. The agent notices the kill through the local driver (the process exit); "
            "a hung engine would instead be noticed by a failed probe (one probe interval plus its timeout).\n\n"
            + table(results) +
            "\n\nTarget (issue 10): warm → serving time-to-effect at the gateways ≤ 1 s. Backfill is a cold start "
            "(process, weights, self-test, admission canary) and is what the warm pool hides from clients."
            "\n\nAlias flips in a one-zone pool keeping one warm instance on the previous version "
            "(`warm_previous: 1`, `old_generation_grace` 0.5 s), agent alone: alias moved → the alias' version holds "
            "a lease.\n\n" + table(rollbacks))
    if results:
        print(table(results))
    if rollbacks:
        print(table(rollbacks))
    if args.write:
        replace_section(args.write, "## Warm pool promotion and zone loss (bench/pool.py)", body)


if __name__ == "__main__":
    main()
