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
from cutover.drivers.base import AnycastState, AnycastTarget, DnsState, DnsTarget, L7State, L7Target
from cutover.drivers.step import StepCheck


@pytest.fixture
def read_factory(db_engine: Any) -> Any:
    return build_session_factory(db_engine, read_only=True)


ScriptedTarget = AnycastTarget | L7Target | DnsTarget
ScriptedState = AnycastState | L7State | DnsState
SERVING, TAKEN_OVER = ("192.0.2.10",), ("198.51.100.10",)  # a scripted DNS record's answer in and out


def scripted_target(tier: RoutingTier, key: str) -> ScriptedTarget:
    """A scripted tier's target, named by `key`: an anycast prefix, an HAProxy "backend/server", a DNS name."""
    if tier == RoutingTier.ANYCAST:
        return AnycastTarget(prefix=key, zone="zone-s", next_hop="192.0.2.254")  # one speaker stands in for all
    if tier == RoutingTier.L7:
        backend, server = key.split("/")
        return L7Target(backend=backend, server=server)
    if tier == RoutingTier.DNS:
        return DnsTarget(zone="lifeline.test.", name=key)
    raise ValueError(f"no scripted {tier} tier")


def scripted_key(target: ScriptedTarget) -> str:
    if isinstance(target, AnycastTarget):
        return target.prefix
    if isinstance(target, L7Target):
        return f"{target.backend}/{target.server}"
    return target.name


def scripted_state(target: ScriptedTarget, announced: bool) -> ScriptedState:
    """The tier's state for "announced" (in routing) or not: announced, ready or drain, the answer of which region."""
    if isinstance(target, AnycastTarget):
        return AnycastState(target=target, announced=announced)
    if isinstance(target, L7Target):
        return L7State(target=target, admin_state="ready" if announced else "drain", weight=100)
    return DnsState(target=target, values=SERVING if announced else TAKEN_OVER, ttl_s=60)


def announced_in(state: ScriptedState) -> bool:
    if isinstance(state, AnycastState):
        return state.announced
    if isinstance(state, L7State):
        return state.admin_state == "ready"
    return state.values == SERVING


class ScriptedDriver:
    """An in-memory tier (standing in for a routing system) whose verification and apply can be scripted.

    Its targets are keyed (`scope_targets`, `announced`, `applied`, `never_verify`) by a prefix, a
    "backend/server" or a DNS name, as its tier has them (`scripted_target`); its states are that tier's.
    """

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

    def targets(self, scope: Scope, *, generation: int | None = None) -> list[ScriptedTarget]:
        return [scripted_target(self.tier, key) for key in self.scope_targets.get(scope.key, [])]

    def read_state(self, target: ScriptedTarget) -> ScriptedState:
        return scripted_state(target, self.announced.setdefault(scripted_key(target), True))

    def desired(self, before: ScriptedState, target_state: TargetState) -> ScriptedState:
        return scripted_state(before.target, target_state == TargetState.IN)

    def apply(self, desired: ScriptedState) -> None:
        key = scripted_key(desired.target)
        if self.crash_on_apply == key:
            self.crash_on_apply = None
            raise SimulatedCrash(key)
        if self.block is not None:
            self.blocked.set()
            self.block.wait(60)
        self.applied.append((key, announced_in(desired)))
        if key not in self.never_verify:
            self.announced[key] = announced_in(desired)

    def verify(self, expected: ScriptedState, timeout: timedelta) -> StepCheck:
        observed = scripted_state(expected.target, self.announced.get(scripted_key(expected.target), True))
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

    def targets(self, scope: Scope, *, generation: int | None = None) -> list[ScriptedTarget]:
        return [scripted_target(self.tier, p) for p in self.scope_targets.get(scope.key, [])]

    def read_state(self, target: AnycastTarget) -> AnycastState:
        path = self._path(target.prefix)
        return AnycastState(target=target, announced=not path.exists() or path.read_text() == "announced")

    def desired(self, before: AnycastState, target_state: TargetState) -> AnycastState:
        return before.model_copy(update={"announced": target_state == TargetState.IN})

    def apply(self, desired: AnycastState) -> None:
        self._path(desired.target.prefix).write_text("announced" if desired.announced else "withdrawn")

    def verify(self, expected: AnycastState, timeout: timedelta) -> StepCheck:
        import time

        (self.root / "verifying").write_text(expected.target.prefix)
        while (self.root / "hold").exists():
            time.sleep(0.05)
        observed = self.read_state(expected.target)
        return StepCheck(observed == expected, observed, {"observer": "files"})
