"""Shared fixtures of the cutover workflow tests (no tests here): topology, a runtime on virtual time, a scriptable tier.

Imported by the test_cutover_* modules; kept out of conftest.py, which holds the driver tests' daemons.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

from common.clock import ManualClock
from controlplane.db import build_session_factory, session_scope
from controlplane.topology import service as topology
from controlplane.topology.schemas import ClusterCreate
from cutover.drivers.snapshot_l7 import SnapshotL7Driver
from contract.routing_tier import RoutingTier
from cutover.scope import Scope, TargetState
from cutover.policy import CutoverPolicy
from cutover.runtime import CutoverRuntime
from cutover.drivers.base import StepCheck


@pytest.fixture
def read_factory(db_engine: Any) -> Any:
    return build_session_factory(db_engine, read_only=True)


class ScriptedDriver:
    """An in-memory tier (standing in for a routing system) whose verification and apply can be scripted."""

    def __init__(self, tier: RoutingTier = RoutingTier.ANYCAST, name: str = "scripted", *,
                 targets: dict[str, list[str]] | None = None) -> None:
        self.tier = tier
        self.name = name
        self.announced: dict[str, bool] = {}
        self.scope_targets = targets or {}
        self.never_verify: set[str] = set()
        self.applied: list[tuple[str, bool]] = []
        self.block: threading.Event | None = None
        self.blocked = threading.Event()
        self.crash_on_apply: str | None = None

    def targets(self, scope: Scope, *, generation: int | None = None) -> list[dict[str, Any]]:
        return [{"tier": self.tier.value, "prefix": p} for p in self.scope_targets.get(scope.key, [])]

    def read_state(self, target: dict[str, Any]) -> dict[str, Any]:
        return {"target": target, "announced": self.announced.setdefault(target["prefix"], True)}

    def desired(self, before: dict[str, Any], target_state: TargetState) -> dict[str, Any]:
        return {**before, "announced": target_state == TargetState.IN}

    def apply(self, desired: dict[str, Any]) -> None:
        prefix = desired["target"]["prefix"]
        if self.crash_on_apply == prefix:
            self.crash_on_apply = None
            raise SimulatedCrash(prefix)
        if self.block is not None:
            self.blocked.set()
            self.block.wait(60)
        self.applied.append((prefix, desired["announced"]))
        if prefix not in self.never_verify:
            self.announced[prefix] = desired["announced"]

    def verify(self, expected: dict[str, Any], timeout: timedelta) -> StepCheck:
        prefix = expected["target"]["prefix"]
        observed = {"target": expected["target"], "announced": self.announced.get(prefix, True)}
        return StepCheck(observed == expected, observed, {"observer": "scripted", "timeout_s": timeout.total_seconds()})


class SimulatedCrash(BaseException):
    """Escapes every `except Exception`: the runner stops mid-step as if its process died."""


@pytest.fixture
def topology_two_regions(session_factory: Any, clock: ManualClock) -> None:
    """eu (zones eu-a, eu-b; clusters c-eu-a, c-eu-b) and us (zone us-a; cluster c-us-a), all serving model m."""
    with session_scope(session_factory) as session:
        for region, zones in (("eu", ("eu-a", "eu-b")), ("us", ("us-a",))):
            topology.create_region(session, name=region, description="", actor="test", clock=clock)
            for zone in zones:
                topology.create_zone(session, region=region, name=zone, actor="test", clock=clock)
                topology.create_cluster(session, spec=ClusterCreate(name=f"c-{zone}", region=region, zone=zone,
                                                                    model="m", weight=100),
                                        actor="test", clock=clock)


@pytest.fixture
def policy() -> CutoverPolicy:
    return CutoverPolicy(min_wait=timedelta(minutes=5), claim_ttl=timedelta(seconds=60),
                         step_timeout=timedelta(seconds=2))


@pytest.fixture
def scripted() -> ScriptedDriver:
    return ScriptedDriver(targets={"region:eu": ["203.0.113.0/24"], "region:eu/zone:eu-a": ["203.0.113.1/32"]})


@pytest.fixture
def runtime(session_factory: Any, read_factory: Any, clock: ManualClock, policy: CutoverPolicy,
            scripted: ScriptedDriver) -> CutoverRuntime:
    l7 = SnapshotL7Driver(session_factory, read_factory=read_factory, clock=clock, sleep=clock.advance,
                          poll_interval_s=0.1)
    return CutoverRuntime(factory=session_factory, clock=clock, drivers=[l7, scripted], policy=policy)


class FileTierDriver:
    """A tier whose state is files in a directory, so it outlives the process that changed it.

    While `hold` exists, `verify` waits (writing `verifying` first): the
    cutover's process is then in the middle of a step and can be killed
    there. Used by the SIGKILL test, which runs it inside a real
    control-plane process.
    """

    tier = RoutingTier.ANYCAST
    name = "files"

    def __init__(self, root: str, scope_targets: dict[str, list[str]]) -> None:
        from pathlib import Path

        self.root = Path(root)
        self.scope_targets = scope_targets

    def _path(self, prefix: str) -> Any:
        return self.root / prefix.replace("/", "_")

    def targets(self, scope: Scope, *, generation: int | None = None) -> list[dict[str, Any]]:
        return [{"tier": self.tier.value, "prefix": p} for p in self.scope_targets.get(scope.key, [])]

    def read_state(self, target: dict[str, Any]) -> dict[str, Any]:
        path = self._path(target["prefix"])
        return {"target": target, "announced": not path.exists() or path.read_text() == "announced"}

    def desired(self, before: dict[str, Any], target_state: TargetState) -> dict[str, Any]:
        return {**before, "announced": target_state == TargetState.IN}

    def apply(self, desired: dict[str, Any]) -> None:
        self._path(desired["target"]["prefix"]).write_text("announced" if desired["announced"] else "withdrawn")

    def verify(self, expected: dict[str, Any], timeout: timedelta) -> StepCheck:
        import time

        (self.root / "verifying").write_text(expected["target"]["prefix"])
        while (self.root / "hold").exists():
            time.sleep(0.05)
        observed = self.read_state(expected["target"])
        return StepCheck(observed == expected, observed, {"observer": "files"})
