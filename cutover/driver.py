"""The one interface every cutover tier's driver implements.

A driver changes one routing tier of the real system and reads it back. The
cutover service (plan → execute → verify → complete | roll back) only ever
talks to this interface; it never knows whether DNS is BIND9 or Route 53.

    class TierDriver(Protocol[S]):
        tier                                  RoutingTier this driver acts at
        read_state(target) -> S               the real state, read back from the system
        apply(desired: S) -> None             write it (idempotent; retried when unreachable)
        verify(expected: S, timeout) -> Verification
                                              poll the real system until it shows
                                              `expected` or `timeout` passes
        restore(before: S, timeout) -> Verification
                                              apply(before) + verify(before): rollback

A cutover step is therefore

    before = driver.read_state(target)        # record it in the step's event
    driver.apply(after)                       # after = before.model_copy(update=...)
    proof = driver.verify(after, timeout)     # raises VerificationFailed on timeout
    ...
    driver.restore(before, timeout)           # rollback, itself evented

States are frozen pydantic models, one per tier, discriminated by `tier`, so
the service can store `state.model_dump(mode="json")` as the event's
before/after and rebuild it after a restart with `parse_state(json)`:

    tier      target (what)                          state (how it is)
    dns       DnsTarget(zone, name, rdtype)          DnsState(values, ttl_s)
    anycast   AnycastTarget(prefix, zone, next_hop)  AnycastState(announced)
    l7        L7Target(backend, server)              L7State(admin_state, weight)
    mesh      MeshTarget(namespace, virtual_service, MeshState(weights per destination,
                         route, destinations)              reconciled)

`verify` returns a `Verification`: what was expected and observed, whether
they matched, the evidence as the system printed it (the DNS answer, BIRD's
route, HAProxy's server line), how many polls it took and the time to effect
measured from this driver's last `apply` of that target (or from the start
of `verify` when this driver did not apply it, e.g. after a restart). DNS
also reports `client_cache_ttl_s`: how long resolvers may still serve the
answer that was replaced (its TTL), which bounds the real cutover time.

Errors (all `LifelineError`, rendered by the control plane's one handler):

    DriverError                  502 cutover_driver_error
    ├── DriverUnavailable        503 cutover_driver_unavailable
    │                                the system could not be reached; `apply`
    │                                and `read_state` retry it (tenacity) first
    ├── DriverRejected           502 cutover_driver_rejected
    │                                the system answered and refused (bad TSIG
    │                                key, unknown server, no such zone):
    │                                permanent, never retried
    └── VerificationFailed       504 cutover_verification_failed
                                     `verify` timed out; `.verification` holds
                                     the last observation as evidence

Drivers are synchronous (dnspython, boto3, sockets, `birdc`); callers on an
event loop run them in a thread. Their shared polling loop and retry
(`PollingDriver`, `retry_unavailable`) are in cutover/drivers/polling.py:
time comes from an injected `Clock` and sleeps from an injected `sleep`,
so the loop is bounded by the timeout and testable on virtual time.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, ClassVar, Literal, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from common.errors import LifelineError
from controlplane.event.models import RoutingTier

# ---------------------------------------------------------------- errors


class DriverError(LifelineError):
    status_code = 502
    error_type = "cutover_driver_error"


class DriverUnavailable(DriverError):
    """The routing system could not be reached (connection refused, timeout)."""

    status_code = 503
    error_type = "cutover_driver_unavailable"


class DriverRejected(DriverError):
    """The routing system answered and refused the change; retrying will not help."""

    error_type = "cutover_driver_rejected"


class VerificationFailed(DriverError):
    """The system did not show the expected state before the timeout."""

    status_code = 504
    error_type = "cutover_verification_failed"

    def __init__(self, message: str, *, verification: Verification) -> None:
        super().__init__(message)
        self.verification = verification


# ---------------------------------------------------------------- records


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DnsTarget(_Record):
    """One record set on an authoritative server (BIND9 via RFC 2136, or Route 53)."""

    tier: Literal[RoutingTier.DNS] = RoutingTier.DNS
    zone: str = Field(description="zone apex, absolute: 'lifeline.test.'")
    name: str = Field(description="owner name, absolute: 'api.lifeline.test.'")
    rdtype: str = "A"


class DnsState(_Record):
    tier: Literal[RoutingTier.DNS] = RoutingTier.DNS
    target: DnsTarget
    values: tuple[str, ...] = Field(description="rdata as text, sorted; empty: no such record")
    ttl_s: int

    def matches(self, observed: DnsState) -> bool:
        return observed.target == self.target and observed.values == self.values and observed.ttl_s == self.ttl_s


class AnycastTarget(_Record):
    """One zone's announcement of the region's service prefix."""

    tier: Literal[RoutingTier.ANYCAST] = RoutingTier.ANYCAST
    prefix: str = Field(description="the service prefix, '203.0.113.10/32'")
    zone: str = Field(description="the announcing zone, 'eu-west-1a'")
    next_hop: str = Field(description="the zone's BGP next hop; identifies its path at the observer")


class AnycastState(_Record):
    tier: Literal[RoutingTier.ANYCAST] = RoutingTier.ANYCAST
    target: AnycastTarget
    announced: bool

    def matches(self, observed: AnycastState) -> bool:
        return observed.target == self.target and observed.announced == self.announced


L7AdminState = Literal["ready", "drain", "maint"]


class L7Target(_Record):
    """One server of one backend of an L4-L7 proxy (HAProxy)."""

    tier: Literal[RoutingTier.L7] = RoutingTier.L7
    backend: str
    server: str


class L7State(_Record):
    tier: Literal[RoutingTier.L7] = RoutingTier.L7
    target: L7Target
    admin_state: L7AdminState
    weight: int = Field(ge=0, le=256)

    def matches(self, observed: L7State) -> bool:
        return (observed.target == self.target and observed.admin_state == self.admin_state
                and observed.weight == self.weight)


class MeshTarget(_Record):
    """One weighted HTTP route of a service mesh (an Istio VirtualService's `http[]` entry, by name).

    `destinations` are the ones this step moves — the scope's — as
    `host` or `host/subset`; the route's other destinations take up the share.
    """

    tier: Literal[RoutingTier.MESH] = RoutingTier.MESH
    namespace: str
    virtual_service: str
    route: str
    destinations: tuple[str, ...] = Field(min_length=1)


class MeshState(_Record):
    tier: Literal[RoutingTier.MESH] = RoutingTier.MESH
    target: MeshTarget
    weights: dict[str, int] = Field(description="every destination of the route → its weight (Istio: sums to 100)")
    reconciled: bool = Field(True, description="the mesh's control plane reports this spec pushed to its proxies")

    def matches(self, observed: MeshState) -> bool:
        return (observed.target == self.target and observed.weights == self.weights
                and observed.reconciled == self.reconciled)


Target = Annotated[DnsTarget | AnycastTarget | L7Target | MeshTarget, Field(discriminator="tier")]
TierState = Annotated[DnsState | AnycastState | L7State | MeshState, Field(discriminator="tier")]

_STATE_ADAPTER: TypeAdapter[DnsState | AnycastState | L7State | MeshState] = TypeAdapter(TierState)
_TARGET_ADAPTER: TypeAdapter[DnsTarget | AnycastTarget | L7Target | MeshTarget] = TypeAdapter(Target)


def parse_state(data: object) -> DnsState | AnycastState | L7State | MeshState:
    """Rebuild a state stored as JSON (an event's before/after) — e.g. to roll back after a restart."""
    return _STATE_ADAPTER.validate_python(data)


def parse_target(data: object) -> DnsTarget | AnycastTarget | L7Target | MeshTarget:
    return _TARGET_ADAPTER.validate_python(data)


class Verification(_Record):
    """Proof that the real system shows a state, or the last observation when it did not."""

    tier: RoutingTier
    expected: TierState
    observed: TierState
    verified: bool
    evidence: str = Field(description="what the system printed at the last poll")
    polls: int
    time_to_effect_s: float = Field(description="from this driver's last apply (or verify's start) to the match")
    measured_from: Literal["apply", "verify"]
    client_cache_ttl_s: int | None = Field(
        default=None, description="dns: resolvers may serve the replaced answer this much longer")


# ---------------------------------------------------------------- the protocol

S = TypeVar("S", DnsState, AnycastState, L7State, MeshState)


@runtime_checkable
class TierDriver(Protocol[S]):
    tier: ClassVar[RoutingTier]

    def read_state(self, target: Target) -> S: ...

    def apply(self, desired: S) -> None: ...

    def verify(self, expected: S, timeout: timedelta) -> Verification: ...

    def restore(self, before: S, timeout: timedelta) -> Verification: ...
