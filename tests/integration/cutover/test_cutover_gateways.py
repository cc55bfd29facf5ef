"""The l7 tier confirms a change through the gateways' own reports of the snapshot they applied."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from common.clock import ManualClock
from contract.events import GatewayReport
from controlplane.db import session_scope
from controlplane.gateway_report import service as reports
from controlplane.snapshot import service as snapshot_service
from cutover import flows, service as cutover_service
from cutover.drivers.snapshot_l7 import ReportedGatewayVersions, SnapshotL7Driver
from cutover.models import CutoverMode
from cutover.scope import Scope, ScopeKind, TargetState
from contract.routing_tier import RoutingTier
from cutover.policy import CutoverPolicy
from cutover.runtime import CutoverRuntime
from tests.integration.cutover.test_cutover_support import (  # noqa: F401 - fixtures
    policy,
    read_factory,
    topology_two_regions,
)

pytestmark = pytest.mark.usefixtures("topology_two_regions")

EU_A = Scope(ScopeKind.ZONE, "eu", "eu-a")


class Gateways:
    """Gateway replicas that report what they applied, as `PUT /api/v1/gateways/{replica}` stores it."""

    def __init__(self, factory: Any, clock: ManualClock) -> None:
        self.factory = factory
        self.clock = clock
        self.following: set[str] = set()  # replicas that apply each new snapshot when they poll

    def report(self, replica: str, version: int | None, epoch: str | None = "ours") -> None:
        """`epoch`: "ours" (this database's, as a gateway that applied our snapshot says), another, or None."""
        with session_scope(self.factory) as session:
            if epoch == "ours":
                epoch = snapshot_service.build_snapshot(session).controlplane_epoch
            reports.store(session, replica_id=replica, actor="test", clock=self.clock, report=GatewayReport(
                replica_id=replica, region="eu", zone="eu-a", snapshot_version=version, snapshot_epoch=epoch,
                routing_source="snapshot", reported_at=self.clock.utcnow()))

    def current(self) -> int:
        with session_scope(self.factory) as session:
            return snapshot_service.build(session)["version"]

    def poll(self, seconds: float) -> None:
        """The verify loop's sleep: time passes and following replicas catch up."""
        self.clock.advance(seconds)
        for replica in sorted(self.following):
            self.report(replica, self.current())


@pytest.fixture
def gateways(session_factory: Any, clock: ManualClock) -> Gateways:
    return Gateways(session_factory, clock)


@pytest.fixture
def runtime(session_factory: Any, read_factory: Any, clock: ManualClock, policy: CutoverPolicy,
            gateways: Gateways) -> CutoverRuntime:
    l7 = SnapshotL7Driver(
        session_factory, read_factory=read_factory, clock=clock, sleep=gateways.poll, poll_interval_s=0.1,
        gateways=ReportedGatewayVersions(read_factory, clock=clock, stale_after=timedelta(seconds=30)),
    )
    return CutoverRuntime(factory=session_factory, clock=clock, drivers=[l7], policy=policy)


def plan(runtime: CutoverRuntime) -> int:
    with session_scope(runtime.factory) as session:
        cutover, _ = cutover_service.plan(session, runtime, scope=EU_A, tiers=[RoutingTier.L7],
                                          target_state=TargetState.OUT, reason="eu-a", mode=CutoverMode.MANUAL,
                                          actor="op")
        return cutover.id


def test_a_step_verifies_once_every_fresh_gateway_applied_the_new_snapshot(
    runtime: CutoverRuntime, gateways: Gateways
) -> None:
    gateways.report("gw-1", gateways.current())
    gateways.report("gw-2", gateways.current())
    gateways.following = {"gw-1", "gw-2"}
    done = flows.execute(runtime, cutover_id=plan(runtime), idempotency_key="k", actor="op")
    assert done.state == "completed"
    evidence = done.steps[0].evidence
    assert evidence["gateway_versions"] == {"gw-1": evidence["snapshot_version"], "gw-2": evidence["snapshot_version"]}
    assert evidence["gateways_lagging"] == [] and evidence["polls"] >= 2


def test_a_gateway_that_does_not_apply_fails_the_step_and_the_rollback_waits_for_it(
    runtime: CutoverRuntime, gateways: Gateways
) -> None:
    gateways.report("gw-1", gateways.current())  # never polls again
    cutover_id = plan(runtime)
    done = flows.execute(runtime, cutover_id=cutover_id, idempotency_key="k", actor="op")
    assert done.steps[0].evidence["gateways_lagging"] == ["gw-1"]
    # The revert cannot be confirmed either while gw-1 applies nothing: the cutover needs a person.
    assert done.state == "failed" and done.steps[0].status == "revert_failed"
    gateways.report("gw-1", gateways.current())
    again = flows.rollback(runtime, cutover_id=cutover_id, actor="op", reason="gw-1 is back")
    assert again.state == "rolled_back"


def test_a_stale_gateway_is_named_but_does_not_block(
    runtime: CutoverRuntime, gateways: Gateways, clock: ManualClock
) -> None:
    gateways.report("gw-dead", gateways.current())
    clock.advance(timedelta(seconds=31))
    gateways.report("gw-1", gateways.current())
    gateways.following = {"gw-1"}
    done = flows.execute(runtime, cutover_id=plan(runtime), idempotency_key="k", actor="op")
    assert done.state == "completed"
    assert done.steps[0].evidence["gateways_stale"] == ["gw-dead"]
    assert list(done.steps[0].evidence["gateway_versions"]) == ["gw-1"]


def test_without_a_fresh_report_the_snapshot_version_alone_verifies_and_says_so(runtime: CutoverRuntime) -> None:
    done = flows.execute(runtime, cutover_id=plan(runtime), idempotency_key="k", actor="op")
    assert done.state == "completed"
    assert "snapshot version alone" in done.steps[0].evidence["gateway_reports"]


@pytest.mark.parametrize("epoch", ["0f0f0f0f-dead-4bee-8bad-000000000099", None])
def test_a_report_from_another_control_plane_epoch_is_not_counted_as_applied(
    runtime: CutoverRuntime, gateways: Gateways, epoch: str | None
) -> None:
    """A gateway that applied another database's snapshot (a higher version there) has applied nothing here."""
    gateways.report("gw-1", gateways.current() + 100, epoch=epoch)  # fresh, and far "ahead": of another count
    done = flows.execute(runtime, cutover_id=plan(runtime), idempotency_key="k", actor="op")
    assert done.steps[0].evidence["gateways_lagging"] == ["gw-1"]
    assert done.steps[0].evidence["gateway_versions"] == {"gw-1": None}
    assert done.state == "failed"
