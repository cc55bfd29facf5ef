"""The cutover workflow's face of every tier driver: `StepDriver`, and the one typed state a step stores.

The workflow (plan → execute → verify → complete | roll back) only ever
talks to `StepDriver`; it never knows whether DNS is BIND9 or Route 53.
Its states are frozen pydantic models, each carrying its own target, which
a step stores (expected and actual before-state, expected after-state) and
its events copy as `model_dump(mode="json")`, so a cutover can be resumed or
rolled back by another process after a crash:

    class StepDriver(Protocol):
        tier, name                                   the tier it acts at; which driver of it (stored per step)
        targets(scope, generation?) -> [StepTarget]  what this tier changes for the scope (planning)
        read_state(target) -> StepState              the real state now
        desired(before, target_state) -> StepState  the state the tier should show after the step
        apply(desired) -> None                       write it (idempotent: a resumed step writes it again)
        verify(expected, timeout) -> StepCheck       poll until the tier shows it; never raises on a
                                                     mismatch (a driver error is a failed check)

A driver is only handed targets and states of its own kind: a step stores
its driver's name, and the runner asks that driver. Every tier driver lives
in cutover/drivers/ and is one of

    snapshot_l7.py, snapshot_mesh.py   the built-in l7 and mesh tiers, through the control plane's snapshot
                                       (StepDrivers themselves, with the states below)
    dns.py, anycast.py, haproxy.py,    a routing system's `TierDriver` (cutover/drivers/base.py), which the
    istio.py                           workflow reaches through `adapter.TierDriverAdapter`
    recorded_only.py                   a tier with no driver configured: recorded, nothing changed

`StepState` is every tier's state, one model per shape:

    driver           target                                   state
    dns, anycast,    DnsTarget, AnycastTarget, L7Target,      DnsState, AnycastState, L7State, MeshState
    l7, mesh         MeshTarget (base.py)                     (base.py), told apart by `tier`
    snapshot (l7)    SnapshotClusterTarget(cluster, region)   SnapshotClusterState(state, weight)
                     SnapshotInstanceTarget(region,           SnapshotInstanceState(ejected)
                       instance_id, generation)
    snapshot (mesh)  MeshRouteTarget(model, route_region,     MeshRouteState(destinations: version, zone, weight)
                       cohort, zone, region)
    recorded-only    RecordedOnlyTarget(tier, scope)          RecordedOnlyState(target_state: out | in | None)

The built-in tiers' states carry no `tier`; they are told apart by their
target's `kind` (or its `recorded_only`). That is the JSON every release
has stored, so a row written before these models existed parses into them
and dumps back to the same JSON. It is parsed in one place: the step
columns' type (`StepStateJSON`, cutover/models.py), on load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Discriminator, Tag, TypeAdapter

from contract.mesh import MeshDestination
from contract.routing_tier import RoutingTier
from controlplane.topology.models import ClusterState
from cutover.drivers.base import (
    AnycastState,
    AnycastTarget,
    DnsState,
    DnsTarget,
    L7State,
    L7Target,
    MeshState,
    MeshTarget,
)
from cutover.scope import Scope, TargetState


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SnapshotClusterTarget(_Record):
    """A cluster of the topology: "out" drains it, "in" makes it active (cutover/drivers/snapshot_l7.py)."""

    kind: Literal["cluster"] = "cluster"
    cluster: str
    region: str


class SnapshotClusterState(_Record):
    target: SnapshotClusterTarget
    state: ClusterState | Literal["absent"]  # absent: no such cluster (any more)
    weight: int


class SnapshotInstanceTarget(_Record):
    """One endpoint generation of an instance: "out" ejects it, "in" lifts the ejection."""

    kind: Literal["instance"] = "instance"
    region: str
    instance_id: str
    generation: int


class SnapshotInstanceState(_Record):
    target: SnapshotInstanceTarget
    ejected: bool


class MeshRouteTarget(_Record):
    """A mesh route of the control plane that names the zone (cutover/drivers/snapshot_mesh.py).

    `route_region` and `cohort` are the route's own (`*`: every region, the
    default route); `zone` and `region` are the cutover's.
    """

    kind: Literal["mesh_route"] = "mesh_route"
    model: str
    route_region: str
    cohort: str
    zone: str
    region: str


class MeshRouteState(_Record):
    target: MeshRouteTarget
    destinations: tuple[MeshDestination, ...]  # empty: the route no longer exists


class RecordedOnlyTarget(_Record):
    """A tier with no driver configured (cutover/drivers/recorded_only.py); `scope` is the event log's scope key."""

    tier: RoutingTier
    recorded_only: Literal[True] = True
    scope: str


class RecordedOnlyState(_Record):
    target: RecordedOnlyTarget
    target_state: TargetState | None  # None: as read (nothing to read); out | in: as the step would leave it


StepTarget = (DnsTarget | AnycastTarget | L7Target | MeshTarget | SnapshotClusterTarget | SnapshotInstanceTarget
              | MeshRouteTarget | RecordedOnlyTarget)

_TAGS: dict[type[BaseModel], str] = {
    DnsState: "dns", AnycastState: "anycast", L7State: "l7", MeshState: "mesh",
    SnapshotClusterState: "cluster", SnapshotInstanceState: "instance", MeshRouteState: "mesh_route",
    RecordedOnlyState: "recorded_only",
}


def _shape(state: object) -> str | None:
    """Which model a state is: a routing system's by its `tier`, a built-in tier's by its target's `kind`."""
    if not isinstance(state, dict):
        return _TAGS.get(type(state))  # serializing a model (the API's StepRead)
    if "tier" in state:
        return str(state["tier"])
    target = state.get("target")
    if not isinstance(target, dict):
        return None
    return "recorded_only" if target.get("recorded_only") is True else target.get("kind")


StepState = Annotated[
    Annotated[DnsState, Tag("dns")] | Annotated[AnycastState, Tag("anycast")] | Annotated[L7State, Tag("l7")]
    | Annotated[MeshState, Tag("mesh")] | Annotated[SnapshotClusterState, Tag("cluster")]
    | Annotated[SnapshotInstanceState, Tag("instance")] | Annotated[MeshRouteState, Tag("mesh_route")]
    | Annotated[RecordedOnlyState, Tag("recorded_only")],
    Discriminator(_shape),
]

_STEP_STATE: TypeAdapter[StepState] = TypeAdapter(StepState)


def parse_step_state(stored: object) -> StepState:
    """A step's state from the JSON its row holds. Only the step columns' type calls it (cutover/models.py)."""
    return _STEP_STATE.validate_python(stored)


def describe_target(target: StepTarget) -> str:
    """A short, stable label for a step's driver_target column: the target's JSON fields but `tier`, by name."""
    fields = target.model_dump(mode="json")
    return ",".join(f"{k}={fields[k]}" for k in sorted(fields) if k != "tier")[:400]


# ---------------------------------------------------------------- the protocol


@dataclass(frozen=True)
class StepCheck:
    """A step's verification: whether the tier shows the expected state, what it showed, and the driver's evidence."""

    verified: bool
    observed: StepState | None  # None: nothing could be read (the driver failed)
    evidence: dict[str, Any] = field(default_factory=dict)


class StepDriver(Protocol):
    tier: RoutingTier
    name: str

    def targets(self, scope: Scope, *, generation: int | None = None) -> list[StepTarget]: ...

    def read_state(self, target: StepTarget) -> StepState: ...

    def desired(self, before: StepState, target_state: TargetState) -> StepState: ...

    def apply(self, desired: StepState) -> None: ...

    def verify(self, expected: StepState, timeout: timedelta) -> StepCheck: ...
