"""The typed interface of a routing system's driver (`TierDriver`), and each such tier's typed target and state.

A driver changes one routing tier of the real system (BIND9 or Route 53,
ExaBGP and BIRD, HAProxy, Istio) and reads it back. The cutover workflow
never calls one directly: it speaks `StepDriver` (cutover/drivers/step.py),
and reaches these through `adapter.TierDriverAdapter`, which hands them the
step's states as they are. A routing system's driver is typed:

    class TierDriver(Protocol[S]):
        tier                                  RoutingTier this driver acts at
        read_state(target) -> S               the real state, read back from the system
        apply(desired: S) -> None             write it (idempotent; retried when unreachable)
        verify(expected: S, timeout) -> Verification
                                              poll the real system until it shows
                                              `expected` or `timeout` passes
        restore(before: S, timeout) -> Verification
                                              apply(before) + verify(before): rollback

A cutover step through it is therefore

    before = driver.read_state(target)        # record it in the step's event
    driver.apply(after)                       # after = before.model_copy(update=...)
    proof = driver.verify(after, timeout)     # raises VerificationFailed on timeout
    ...
    driver.restore(before, timeout)           # rollback (apply + verify of the recorded before), evented

States are frozen pydantic models, one per tier, discriminated by `tier`,
each carrying its target; they are members of the workflow's `StepState`
(step.py), which a step stores as `state.model_dump(mode="json")` and
rebuilds on load after a restart:

    tier      target (what)                          state (how it is)
    dns       DnsTarget(zone, name, rdtype,          DnsState(values, ttl_s,
                        internal_name?, scope?)               internal_values?, internal_ttl_s?)
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
answer that was replaced (its TTL), which bounds the real cutover time; and,
where the target has the long-TTL internal record, `internal_cache_ttl_s`:
the same for the region's own services (cutover/drivers/dns.py says why).

Over 300 lines on purpose: the protocol and every routing system's typed
target and state are one contract, read together, and split they would be
read apart. The workflow's face (`StepDriver`, the built-in tiers' states,
the union a step stores) is step.py's.

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

from collections.abc import Sequence
from datetime import timedelta
from typing import Annotated, ClassVar, Literal, NamedTuple, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from common.errors import LifelineError
from contract.routing_tier import RoutingTier
from cutover.scope import Scope

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


# The seed's dual TTL (§4), the defaults of the drivers file's [dns] table.
EXTERNAL_TTL_S = 60  # the record clients resolve: a cutover reaches them within a minute of the write
INTERNAL_TTL_S = 600  # the region's own services' record: resolvable for ten minutes without a DNS server


def _unset(value: object) -> bool:
    return value is None


class DnsTarget(_Record):
    """A record set on an authoritative server (BIND9 via RFC 2136, or Route 53), and optionally its internal twin.

    `internal_name` is the dual TTL's long-lived record, in the same zone and
    of the same type; the driver writes both in one UPDATE (one Route 53
    change batch). Unset, it is left out of the JSON, so a target stored
    before it existed reads and labels as it always did.

    `scope` is the cutover's (a cutover plans it in): one record answers for
    every region, and "region eu out" means the answer of the region that
    takes over from eu, which the record's current answer cannot tell. It is
    not part of the record: the drivers never send it, and key what they
    know of a record by `record()`. Unset, it is left out of the JSON too.
    """

    tier: Literal[RoutingTier.DNS] = RoutingTier.DNS
    zone: str = Field(description="zone apex, absolute: 'lifeline.test.'")
    name: str = Field(description="owner name, absolute: 'api.lifeline.test.'")
    rdtype: str = "A"
    internal_name: str | None = Field(
        None, exclude_if=_unset, description="the long-TTL internal record, absolute: 'api.internal.lifeline.test.'")
    scope: Scope | None = Field(None, exclude_if=_unset, description="the cutover scope whose answer it takes")

    def record(self) -> DnsTarget:
        """The record set(s) alone, without the cutover's scope."""
        return self if self.scope is None else self.model_copy(update={"scope": None})

    def names(self) -> tuple[str, ...]:
        return (self.name,) if self.internal_name is None else (self.name, self.internal_name)


class DnsRecordSet(NamedTuple):
    """One owner name's answer as a driver reads or writes it; no values: no such record."""

    name: str
    values: tuple[str, ...]
    ttl_s: int


class DnsState(_Record):
    """The target's records as the server has them: the external one, and the internal one where it has a name."""

    tier: Literal[RoutingTier.DNS] = RoutingTier.DNS
    target: DnsTarget
    values: tuple[str, ...] = Field(description="rdata as text, sorted; empty: no such record")
    ttl_s: int
    internal_values: tuple[str, ...] | None = Field(
        None, exclude_if=_unset, description="the internal record's, as `values`; None: the target has none")
    internal_ttl_s: int | None = Field(None, exclude_if=_unset)

    @model_validator(mode="after")
    def _internal_with_its_name(self) -> DnsState:
        has_name = self.target.internal_name is not None
        if (self.internal_values is not None) != has_name or (self.internal_ttl_s is not None) != has_name:
            raise ValueError("internal_values and internal_ttl_s are set exactly when the target has an internal_name")
        return self

    @classmethod
    def from_record_sets(cls, target: DnsTarget, record_sets: Sequence[DnsRecordSet]) -> DnsState:
        """The state of `target` from its record sets read back, in `target.names()` order."""
        external, *internal = record_sets
        if target.internal_name is None:
            return cls(target=target, values=external.values, ttl_s=external.ttl_s)
        return cls(target=target, values=external.values, ttl_s=external.ttl_s,
                   internal_values=internal[0].values, internal_ttl_s=internal[0].ttl_s)

    def record_sets(self) -> tuple[DnsRecordSet, ...]:
        external = DnsRecordSet(self.target.name, self.values, self.ttl_s)
        if self.target.internal_name is None:
            return (external,)
        internal = DnsRecordSet(self.target.internal_name, self.internal_values or (), self.internal_ttl_s or 0)
        return (external, internal)

    def matches(self, observed: DnsState) -> bool:
        return observed.target == self.target and observed.record_sets() == self.record_sets()


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
    internal_cache_ttl_s: int | None = Field(
        default=None, description="dns, internal record: the region's own services may keep its replaced answer "
                                  "this much longer (the long TTL)")


# ---------------------------------------------------------------- the protocol, typed

S = TypeVar("S", DnsState, AnycastState, L7State, MeshState)


@runtime_checkable
class TierDriver(Protocol[S]):
    tier: ClassVar[RoutingTier]

    def read_state(self, target: Target) -> S: ...

    def apply(self, desired: S) -> None: ...

    def verify(self, expected: S, timeout: timedelta) -> Verification: ...

    def restore(self, before: S, timeout: timedelta) -> Verification: ...
