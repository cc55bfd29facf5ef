"""The built-in l7 tier: Lifeline's own gateways, through the control plane's snapshot.

Acts through the topology service, so every change is the same cluster
update or ejection an operator could make (with its own topology event and
a snapshot version bump), in a unit of work of its own that is committed
before `verify` starts: gateways can only see committed rows.

    target (cutover/drivers/step.py)               state
    SnapshotClusterTarget(cluster, region)         SnapshotClusterState(state: active|draining|ejected|absent,
                                                                        weight)
    SnapshotInstanceTarget(region, instance_id,    SnapshotInstanceState(ejected)
                           generation)

"out" drains a cluster (it finishes what it has and takes nothing new; the
snapshot's tier weight for its zone drops to zero) or ejects an instance
generation; "in" makes the cluster active again or lifts the ejection.

Verification reads the snapshot back (its version and the cluster's or
ejection's entry) and then waits until every gateway of the region that
reports fresh has applied that version or a newer one
(`ReportedGatewayVersions` over the gateways' reports). Without a fresh
report it verifies by the snapshot version alone and says so in the
evidence: the change is in what gateways fetch, not proven to be in what
they route by.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol

from sqlalchemy.orm import Session, sessionmaker

from common.clock import Clock
from contract.snapshot import RoutingSnapshot
from controlplane.db import session_scope
from controlplane.gateway_report import service as reports
from controlplane.snapshot import service as snapshot_service
from controlplane.topology import repository as topology
from controlplane.topology import service as topology_service
from controlplane.topology.models import ClusterState
from controlplane.topology.schemas import ClusterUpdate
from contract.routing_tier import RoutingTier
from cutover.drivers.step import (
    MeshRouteState,
    SnapshotClusterState,
    SnapshotClusterTarget,
    SnapshotInstanceState,
    SnapshotInstanceTarget,
    StepCheck,
)
from cutover.scope import Scope, ScopeKind, TargetState

ACTOR = "controlplane:cutover"


class GatewayVersionReader(Protocol):
    def applied_versions(self, region: str) -> dict[str, int | None] | None:
        """Snapshot version each live gateway replica of the region reports; None if reports are unavailable."""
        ...


class NoGatewayReports:
    def applied_versions(self, region: str) -> dict[str, int | None] | None:
        return None


class ReportedGatewayVersions:
    """The gateways' own reports (`PUT /api/v1/gateways/{replica}`, controlplane.gateway_report).

    Only replicas whose last report is fresh count: a stale replica is dead
    or cut off, and waiting for it would fail — and roll back — exactly the
    cutover that evacuates a failing region. Stale replicas are named in the
    evidence (`gateways_stale`) as unconfirmed. No fresh replica in the
    region: None, and the step verifies by the snapshot version alone.

    It reads `gateway_report.service.list_reports`, not `applied_versions`:
    that one maps a stale replica to None, the same as a fresh replica that
    has applied no snapshot yet, and this needs to tell them apart (the
    first is left out and named, the second is lagging).
    """

    def __init__(self, read_factory: sessionmaker[Session], *, clock: Clock, stale_after: timedelta) -> None:
        self.read_factory = read_factory
        self.clock = clock
        self.stale_after = stale_after
        self.last_stale: list[str] = []

    def applied_versions(self, region: str) -> dict[str, int | None] | None:
        with session_scope(self.read_factory) as session:
            found = reports.list_reports(session, clock=self.clock, stale_after=self.stale_after, region=region)
        self.last_stale = sorted(r.replica_id for r in found if r.stale)
        # A version from another control-plane epoch counts another database's changes: not applied here.
        fresh = {r.replica_id: None if r.foreign_epoch else r.snapshot_version for r in found if not r.stale}
        return fresh or None


class SnapshotL7Driver:
    tier = RoutingTier.L7
    name = "snapshot"

    def __init__(
        self,
        factory: sessionmaker[Session],
        *,
        read_factory: sessionmaker[Session] | None = None,
        clock: Clock,
        sleep: Callable[[float], None] = time.sleep,
        gateways: GatewayVersionReader | None = None,
        poll_interval_s: float = 0.05,
    ) -> None:
        self.factory = factory
        # Reads begin DEFERRED on SQLite, so planning inside a request that holds the write lock does not wait on it.
        self.read_factory = read_factory or factory
        self.clock = clock
        self.sleep = sleep
        self.gateways = gateways or NoGatewayReports()
        self.poll_interval_s = poll_interval_s

    # -- planning
    def targets(self, scope: Scope, *, generation: int | None = None
                ) -> list[SnapshotClusterTarget | SnapshotInstanceTarget]:
        if scope.kind == ScopeKind.INSTANCE:
            if generation is None:
                return []
            return [SnapshotInstanceTarget(region=scope.region, instance_id=scope.name, generation=generation)]
        with session_scope(self.read_factory) as session:
            clusters = topology.list_clusters(session, model=None, region=scope.region)
            return [
                SnapshotClusterTarget(cluster=c.name, region=c.region)
                for c in clusters
                if scope.kind == ScopeKind.REGION or c.zone == scope.name
            ]

    def desired(self, before: SnapshotClusterState | SnapshotInstanceState,
                target_state: TargetState) -> SnapshotClusterState | SnapshotInstanceState:
        if isinstance(before, SnapshotInstanceState):
            return before.model_copy(update={"ejected": target_state == TargetState.OUT})
        state = ClusterState.ACTIVE if target_state == TargetState.IN else ClusterState.DRAINING
        return before.model_copy(update={"state": state})

    # -- reading
    def _read(self, session: Session, target: SnapshotClusterTarget | SnapshotInstanceTarget
              ) -> SnapshotClusterState | SnapshotInstanceState:
        if isinstance(target, SnapshotInstanceTarget):
            ejection = topology.find_ejection(
                session, region=target.region, instance_id=target.instance_id, generation=target.generation
            )
            return SnapshotInstanceState(target=target, ejected=ejection is not None)
        cluster = topology.get_cluster(session, name=target.cluster)
        if cluster is None:
            return SnapshotClusterState(target=target, state="absent", weight=0)
        return SnapshotClusterState(target=target, state=cluster.state, weight=cluster.weight)

    def read_state(self, target: SnapshotClusterTarget | SnapshotInstanceTarget
                   ) -> SnapshotClusterState | SnapshotInstanceState:
        with session_scope(self.read_factory) as session:
            return self._read(session, target)

    # -- writing
    def apply(self, desired: SnapshotClusterState | SnapshotInstanceState) -> None:
        with session_scope(self.factory) as session:
            if self._read(session, desired.target) == desired:
                return  # idempotent: a resumed step finds its change already made
            if isinstance(desired, SnapshotInstanceState):
                if desired.ejected:
                    topology_service.eject_instance(
                        session, region=desired.target.region, instance_id=desired.target.instance_id,
                        generation=desired.target.generation, reason="cutover", actor=ACTOR, clock=self.clock,
                    )
                else:
                    ejection = topology.find_ejection(
                        session, region=desired.target.region, instance_id=desired.target.instance_id,
                        generation=desired.target.generation,
                    )
                    if ejection is not None:
                        topology_service.lift_ejection(
                            session, region=desired.target.region, ejection_id=ejection.id, reason="cutover",
                            actor=ACTOR, clock=self.clock,
                        )
                return
            topology_service.update_cluster(
                session, name=desired.target.cluster,
                change=ClusterUpdate(state=ClusterState(desired.state), weight=desired.weight,
                                     reason="cutover", routing_tier=RoutingTier.L7),
                actor=ACTOR, clock=self.clock,
            )

    # -- verifying
    def _in_snapshot(self, snapshot: RoutingSnapshot, expected: SnapshotClusterState | SnapshotInstanceState) -> bool:
        if isinstance(expected, SnapshotInstanceState):
            target = expected.target
            present = any(
                (e.region, e.instance_id, e.generation) == (target.region, target.instance_id, target.generation)
                for e in snapshot.ejections
            )
            return present == expected.ejected
        for cluster in snapshot.clusters:
            if cluster.name == expected.target.cluster:
                return cluster.state == expected.state and cluster.weight == expected.weight
        return False

    def verify(self, expected: SnapshotClusterState | SnapshotInstanceState | MeshRouteState,
               timeout: timedelta) -> StepCheck:
        """Poll the snapshot and the gateways' reports until both show `expected` (the mesh tier's too)."""
        started = self.clock.now()
        deadline = started + timeout.total_seconds()
        region = expected.target.region
        # Bounded by polls as well as by the clock: a clock that does not move (a test's) cannot make it spin forever.
        max_polls = int(timeout.total_seconds() / self.poll_interval_s) + 2
        polls = 0
        while True:
            polls += 1
            with session_scope(self.read_factory) as session:
                snapshot = snapshot_service.build_snapshot(session)
                observed = self._read(session, expected.target)
            version = snapshot.version
            in_snapshot = self._in_snapshot(snapshot, expected)
            reports = self.gateways.applied_versions(region)
            evidence: dict[str, Any] = {"snapshot_version": version, "in_snapshot": in_snapshot, "polls": polls}
            if getattr(self.gateways, "last_stale", None):
                evidence["gateways_stale"] = list(self.gateways.last_stale)  # type: ignore[attr-defined]
            if reports is None:
                evidence["gateway_reports"] = "unavailable: verified by the snapshot version alone"
                if not isinstance(self.gateways, NoGatewayReports):
                    evidence["gateway_reports"] = "no fresh gateway report in the region: verified by the snapshot version alone"
                caught_up = True
            else:
                evidence["gateway_versions"] = reports
                lagging = sorted(r for r, v in reports.items() if v is None or v < version)
                evidence["gateways_lagging"] = lagging
                caught_up = not lagging
            now = self.clock.now()
            evidence["time_to_effect_s"] = round(now - started, 6)
            if in_snapshot and caught_up:
                return StepCheck(True, observed, evidence)
            if now >= deadline or polls >= max_polls:
                return StepCheck(False, observed, evidence)
            self.sleep(min(self.poll_interval_s, max(0.0, deadline - now)))
