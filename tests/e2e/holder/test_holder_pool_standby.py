"""The pool's LocalDriver restarts holder-backed engines from a warm standby (warm_pool/driver.py, `standby=True`).

Promises tested, on real processes: service recovery (after a SIGKILL of an
engine the driver runs, the instance the agent starts in its place is the
standby process itself, attached to the holder's weights it primed while it
waited, not a new interpreter), semantic recovery (the stream the dead engine was sending
continues token-identically on it from `prompt ‖ committed`), and the
driver's bookkeeping: one standby per holder-backed instance, refilled after
use, retired when the pool shrinks, and none at all for an engine without a
holder, and the dead instance's tenancy released at the holder (no
successor takes it over). The driver is called as the agent calls it (`stop` the lost one,
`start` a new instance id, `refresh` each tick). No wall-clock asserts:
bench/holder.py carries the speed claims.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
from dataclasses import dataclass

import httpx

from common import oneshot_http
from contract.standby import StandbyPrime
from tests.e2e.holder.conftest import PROMPT, completion_tokens, kill_mid_stream, prompt_ids, wait_for
from warm_pool.driver import LocalDriver

MAX_TOKENS = 24
VERSION = "tiny-v1"


@dataclass
class DriverEngine:
    """What `kill_mid_stream` needs of an engine the driver started: its URL and a way to SIGKILL it."""

    url: str
    process: subprocess.Popen

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self.process.send_signal(sig)
        self.process.wait(timeout=15)


def ready(url: str) -> bool:
    try:
        return oneshot_http.get(f"{url}/healthz/ready", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def start(driver: LocalDriver, instance_id: str) -> DriverEngine:
    instance = asyncio.run(driver.start(instance_id=instance_id, zone="z1", version=VERSION))
    process = driver.processes[instance_id].popen
    wait_for(lambda: ready(instance.url) or process.poll() is not None, f"{instance_id} to be ready", timeout=120)
    assert process.poll() is None, (driver.state_dir / instance_id / "engine.log").read_text()[-3000:]
    return DriverEngine(instance.url, process)


def warm_standbys(driver: LocalDriver, count: int) -> list[int]:
    """Tick `refresh` (as the agent does) until `count` standbys are warm; their pids."""
    def settled() -> bool:
        asyncio.run(driver.refresh())
        return len(driver.standbys) == count and all(s.warm for s in driver.standbys)

    wait_for(settled, f"{count} warm standbys", timeout=180)
    return [s.process.pid for s in driver.standbys if s.process is not None]


def test_driver_restarts_a_killed_holder_engine_from_its_standby_and_the_stream_continues(fleet_factory, tmp_path):
    fleet = fleet_factory()
    holder = fleet.start_holder()
    driver = LocalDriver(region="r1", versions={VERSION: fleet.model}, state_dir=tmp_path / "pool",
                         engine_args=["--holder", holder.url], standby=True)
    try:
        first = start(driver, "r1-z1-1")
        assert driver.processes["r1-z1-1"].from_standby is False  # nothing warm yet: a new interpreter
        expected = completion_tokens(first.url, PROMPT, MAX_TOKENS)
        ids = prompt_ids(first.url, PROMPT)
        [standby_pid] = warm_standbys(driver, 1)  # one per holder-backed instance
        # primed for the version the pool runs: it mapped and self-tested the holder's weights, and holds nothing
        assert driver.standbys[0].prime == StandbyPrime(holder.url, fleet.model) and driver.standbys[0].primed
        assert [t["tenant_id"] for t in holder.state()["tenants"]] == ["r1-z1-1"]

        committed = kill_mid_stream(first, PROMPT, MAX_TOKENS, after=9)
        assert not driver.alive("r1-z1-1")
        asyncio.run(driver.stop("r1-z1-1", graceful=False))  # the agent loses it ...
        # ... and it will never come back under its id: the driver ends its tenancy, so its KV blocks and
        # reservations do not stay frozen in the holder for a successor that never comes.
        assert holder.tenant("r1-z1-1")["state"] == "released"
        replacement = start(driver, "r1-z1-2")  # ... and starts another instance in its place
        assert replacement.process.pid == standby_pid  # the standby became the engine: no new interpreter
        assert driver.processes["r1-z1-2"].from_standby is True
        assert driver.standbys == []
        origin = oneshot_http.get(f"{replacement.url}/healthz/weights", timeout=5).json()
        assert (origin["source"], origin["primed"], origin["prime_miss_reason"]) == ("holder", True, None)
        assert "weights mapped from the holder" in (driver.state_dir / "r1-z1-2" / "engine.log").read_text()
        assert committed + completion_tokens(replacement.url, ids + committed, MAX_TOKENS - len(committed)) == expected

        [refill_pid] = warm_standbys(driver, 1)  # refilled for the next crash
        assert refill_pid != standby_pid

        second = start(driver, "r1-z1-3")  # the pool grows: that start uses the refill, and one more is kept
        assert second.process.pid == refill_pid
        assert completion_tokens(second.url, PROMPT, MAX_TOKENS) == expected
        spare_pids = warm_standbys(driver, 2)

        asyncio.run(driver.stop("r1-z1-3", graceful=True))  # the pool shrinks: the surplus standby is retired
        asyncio.run(driver.refresh())
        assert len(driver.standbys) == 1
        retired = [pid for pid in spare_pids if pid not in {s.process.pid for s in driver.standbys if s.process}]
        assert len(retired) == 1
    finally:
        asyncio.run(driver.close())
    assert driver.standbys == [] and driver.processes == {}


def test_driver_keeps_no_standby_for_an_engine_without_a_holder_or_with_standbys_off(fleet_factory, tmp_path):
    fleet = fleet_factory()
    holder = fleet.start_holder()
    plain = LocalDriver(region="r1", versions={VERSION: fleet.model}, state_dir=tmp_path / "plain", standby=True)
    off = LocalDriver(region="r1", versions={VERSION: fleet.model}, state_dir=tmp_path / "off",
                      engine_args=["--holder", holder.url])
    try:
        for driver in (plain, off):
            engine = start(driver, "r1-z1-1")
            asyncio.run(driver.refresh())
            assert driver.standbys == [] and driver.standbys_wanted() == 0
            assert completion_tokens(engine.url, PROMPT, 4)
    finally:
        asyncio.run(plain.close())
        asyncio.run(off.close())
