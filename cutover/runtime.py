"""What the cutover workflow acts with (`CutoverRuntime`), built once per process by `build_runtime(settings)`.

`controlplane/app.py`'s `create_app` builds the served control plane's
runtime at start-up and every route, the console and the expiry loop use
that one (`app.state.cutover_runtime`, which a test may replace);
`lifeline cutover …` and `lifeline zonal-shift …` build the same one
(cutover/cli_runtime.py), so a rollback from the CLI — the way back while
the API is down — restores every tier a cutover touched, under the same
rules:

    drivers   the snapshot's l7 and mesh (cutover/drivers/snapshot_*.py), always,
              then one per table of the drivers file (cutover/drivers_file.py)
    policy    the file's [policy], else cutover.policy's defaults
    capacity  the file's [[capacity.plans]], else none (assertion.capacity is skipped)
    recorded  a tier with no driver is planned recorded only (cutover/drivers/recorded_only.py)

Each configured table becomes one `StepDriver`: a routing system's typed
driver (cutover/drivers/) behind a `TierDriverAdapter` whose `targets_for`
maps a scope to that system's targets as the table says (a DNS target
carries the scope it moves, whose answer `dns_desired` takes). Nothing is
dialled here: a routing system that is down is a
`cutover_driver_unavailable` step at execute time, not a control plane
that will not start. A bad file is `CutoverDriverConfigError`, naming the
file and the key.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session, sessionmaker

from common.clock import Clock, SystemClock
from contract.routing_tier import RoutingTier
from cutover.drivers.adapter import TierDriverAdapter
from cutover.drivers.base import (
    INTERNAL_TTL_S,
    AnycastTarget,
    DnsState,
    DnsTarget,
    L7Target,
    MeshTarget,
)
from cutover.drivers.step import StepDriver
from cutover.drivers.recorded_only import RECORDED_ONLY, RecordedOnlyDriver
from cutover.drivers.snapshot_l7 import GatewayVersionReader, SnapshotL7Driver
from cutover.drivers.snapshot_mesh import SnapshotMeshDriver
from cutover.drivers_file import (
    AnycastConfig,
    CutoverDriversConfig,
    DnsConfig,
    DnsRegion,
    HaproxyConfig,
    IstioConfig,
    load,
)
from cutover.errors import TierNotConfigured
from cutover.scope import Scope, ScopeKind, TargetState
from cutover.policy import CutoverPolicy
from cutover.safety import CapacityPlan

if TYPE_CHECKING:
    from controlplane.config import ControlPlaneSettings


@dataclass
class CutoverRuntime:
    """What the workflow needs, built once by the composition root (or a test)."""

    factory: sessionmaker[Session]
    clock: Clock
    drivers: Sequence[StepDriver]
    policy: CutoverPolicy = field(default_factory=CutoverPolicy)
    capacity: CapacityPlan | None = None
    # For polling reads (the expiry loop): DEFERRED on SQLite, so they never take the write lock.
    read_factory: sessionmaker[Session] | None = None
    # A tier with no driver: refuse the plan (422 tier_not_configured), or record it only (the served
    # control plane: the step changes nothing, says so, and is evented; `cutover.drivers.recorded_only`).
    record_unconfigured: bool = False

    @property
    def reads(self) -> sessionmaker[Session]:
        return self.read_factory or self.factory

    def drivers_for(self, tier: RoutingTier) -> list[StepDriver]:
        return [d for d in self.drivers if d.tier == tier]

    def driver_named(self, tier: str, name: str) -> StepDriver | None:
        if name == RECORDED_ONLY:  # planned as recorded only: it stays so, even if a driver is configured since
            return RecordedOnlyDriver(RoutingTier(tier))
        return next((d for d in self.drivers if d.tier == tier and d.name == name), None)

    def planning_drivers(self, tier: RoutingTier) -> list[StepDriver]:
        """The drivers a plan uses for `tier`; a recorded-only stand-in where none is configured and that is allowed."""
        drivers = self.drivers_for(tier)
        if drivers:
            return drivers
        if self.record_unconfigured:
            return [RecordedOnlyDriver(tier)]
        raise TierNotConfigured(f"no driver is configured for the {tier.value} tier")


def build_runtime(
    settings: ControlPlaneSettings,
    *,
    factory: sessionmaker[Session],
    read_factory: sessionmaker[Session],
    clock: Clock,
    gateways: GatewayVersionReader | None = None,
) -> CutoverRuntime:
    """The runtime of `settings` (its `cutover_drivers_file`), on these session factories; see the module docstring.

    `gateways`: how the snapshot's l7 and mesh confirm a change in the gateways (the served control plane
    reads their reports, `ReportedGatewayVersions`); None verifies by the snapshot version alone. The
    configured drivers poll real routing systems, so they time their timeouts and time to effect on the
    system clock, whatever `clock` is.
    """
    config = load(settings.cutover_drivers_file) if settings.cutover_drivers_file is not None else None
    configured = build_drivers(config, clock=SystemClock()) if config is not None else []
    policy = config.policy.build() if config is not None and config.policy is not None else CutoverPolicy()
    capacity = config.capacity.build() if config is not None and config.capacity is not None else None
    snapshot: dict[str, Any] = {"read_factory": read_factory, "clock": clock, "sleep": time.sleep, "gateways": gateways}
    return CutoverRuntime(
        factory=factory, clock=clock, read_factory=read_factory, policy=policy, capacity=capacity,
        drivers=[SnapshotL7Driver(factory, **snapshot), SnapshotMeshDriver(factory, **snapshot), *configured],
        record_unconfigured=True,  # the served plane plans every tier; one without a driver is recorded only
    )



def _covers(scope: Scope, key: str) -> bool:
    """A configured scope key belongs to `scope` if it is the scope or lies inside it (a region's zones)."""
    return key == scope.key or key.startswith(scope.key + "/")


def _haproxy(config: HaproxyConfig, clock: Clock) -> StepDriver:
    from cutover.drivers.haproxy import HaproxyDriver, HaproxyRuntimeApi

    def targets_for(scope: Scope) -> list[L7Target]:
        refs = sorted({ref for key, refs in config.servers.items() if _covers(scope, key) for ref in refs})
        return [L7Target(backend=ref.split("/")[0], server=ref.split("/")[1]) for ref in refs]

    driver = HaproxyDriver(HaproxyRuntimeApi(config.address(), timeout_s=config.timeout_s), clock=clock)
    return TierDriverAdapter(driver, tier=RoutingTier.L7, name="haproxy", targets_for=targets_for)


def _anycast(config: AnycastConfig, clock: Clock) -> StepDriver:
    from cutover.drivers.anycast import AnycastDriver, BirdRouteReader, ExaBgpApi

    def targets_for(scope: Scope) -> list[AnycastTarget]:
        if scope.kind == ScopeKind.INSTANCE:
            return []
        return [AnycastTarget(prefix=config.prefix, zone=z.zone, next_hop=z.next_hop) for z in config.zones
                if z.region == scope.region and (scope.kind == ScopeKind.REGION or z.zone == scope.name)]

    driver = AnycastDriver(
        speakers={z.zone: ExaBgpApi(z.command_fifo, z.ack_fifo, ack_timeout_s=config.ack_timeout_s)
                  for z in config.zones},
        observer=BirdRouteReader(config.birdc_socket, birdc=config.birdc), clock=clock)
    return TierDriverAdapter(driver, tier=RoutingTier.ANYCAST, name="exabgp", targets_for=targets_for)


def dns_desired(regions: Mapping[str, DnsRegion], ttl_s: int,
                internal_ttl_s: int = INTERNAL_TTL_S) -> Callable[[DnsState, TargetState], DnsState]:
    """out: the answer of the region that takes over; in: the region's own (the region of the target's scope).

    On the external record with its short TTL, and on the internal one (where
    the target has it) with its long TTL (cutover/drivers/dns.py says why both).
    """

    def desired_for(before: DnsState, target_state: TargetState) -> DnsState:
        scope = before.target.scope
        if scope is None:  # not a target of `_dns`'s targets_for, which plans one in
            raise ValueError(f"dns target {before.target.name} names no cutover scope: no region's answer to take")
        region = regions[scope.region]
        answer = tuple(sorted(regions[region.failover_to].answer if target_state == TargetState.OUT
                              else region.answer))
        update: dict[str, Any] = {"values": answer, "ttl_s": ttl_s}
        if before.target.internal_name is not None:
            update |= {"internal_values": answer, "internal_ttl_s": internal_ttl_s}
        return before.model_copy(update=update)

    return desired_for


def _dns(config: DnsConfig, clock: Clock) -> list[StepDriver]:
    from cutover.drivers.dns import Rfc2136Driver, Route53Driver

    def targets_for(scope: Scope) -> list[DnsTarget]:
        if scope.kind != ScopeKind.REGION or scope.region not in config.regions:
            return []
        return [DnsTarget(zone=config.zone, name=config.name, rdtype=config.rdtype,
                          internal_name=config.internal_name, scope=scope)]

    desired_for = dns_desired(config.regions, config.ttl_s, config.internal_ttl_s)
    drivers: list[StepDriver] = []
    if config.rfc2136 is not None:
        spec = config.rfc2136
        driver = Rfc2136Driver(server=spec.server, port=spec.port, key_name=spec.key_name,
                               key_secret=spec.key_secret_file.read_text().strip(), key_algorithm=spec.key_algorithm,
                               io_timeout_s=spec.io_timeout_s, clock=clock)
        drivers.append(TierDriverAdapter(driver, tier=RoutingTier.DNS, name="rfc2136", targets_for=targets_for,
                                         desired_for=desired_for))
    if config.route53 is not None:
        import boto3

        client = boto3.client("route53", endpoint_url=config.route53.endpoint_url,
                              region_name=config.route53.region_name)
        drivers.append(TierDriverAdapter(Route53Driver(client, clock=clock), tier=RoutingTier.DNS,
                                         name="route53", targets_for=targets_for, desired_for=desired_for))
    return drivers


def _istio(config: IstioConfig, clock: Clock) -> StepDriver:
    from kubernetes.client import ApiClient, Configuration

    from cutover.drivers.istio import IstioVirtualServiceDriver

    if config.kubeconfig is not None:
        from kubernetes.config import new_client_from_config

        api_client = new_client_from_config(config_file=str(config.kubeconfig))
    else:
        configuration = Configuration()
        configuration.host = config.host
        configuration.verify_ssl = config.verify_ssl
        if config.ca_file is not None:
            configuration.ssl_ca_cert = str(config.ca_file)
        if config.token_file is not None:
            configuration.api_key = {"authorization": config.token_file.read_text().strip()}
            configuration.api_key_prefix = {"authorization": "Bearer"}
        api_client = ApiClient(configuration)

    def targets_for(scope: Scope) -> list[MeshTarget]:
        return [MeshTarget(namespace=r.namespace, virtual_service=r.virtual_service, route=r.route,
                           destinations=tuple(r.destinations)) for r in config.routes if r.scope == scope.key]

    driver = IstioVirtualServiceDriver(api_client, api_version=config.api_version,
                                       require_reconciled=config.require_reconciled, clock=clock)
    return TierDriverAdapter(driver, tier=RoutingTier.MESH, name="istio", targets_for=targets_for)


def build_drivers(config: CutoverDriversConfig, *, clock: Clock) -> list[StepDriver]:
    """The configured tiers' drivers, as the cutover workflow speaks to them (besides the snapshot's l7 and mesh)."""
    drivers: list[StepDriver] = []
    if config.haproxy is not None:
        drivers.append(_haproxy(config.haproxy, clock))
    if config.istio is not None:
        drivers.append(_istio(config.istio, clock))
    if config.anycast is not None:
        drivers.append(_anycast(config.anycast, clock))
    if config.dns is not None:
        drivers.extend(_dns(config.dns, clock))
    return drivers
