"""Which routing systems the served control plane drives, and its cutover policy: typed, read once at start-up.

`LIFELINE_CONTROLPLANE_CUTOVER_DRIVERS_FILE` names a TOML file; each table
configures one tier's driver, and a tier without one is *recorded only*
(its cutover steps change nothing and say so; `cutover.tiers.RecordedOnlyDriver`).
The l7 and mesh tiers through Lifeline's own snapshot are always there.

    [haproxy]                       l7: HAProxy's runtime API
    runtime_api = "127.0.0.1:9999"  #   host:port or an absolute UNIX socket path
    [haproxy.servers]               #   scope → "backend/server"; a region covers its zones and instances
    "region:eu/zone:eu-a" = ["llm/s1"]

    [anycast]                       anycast: ExaBGP per zone, BIRD observing
    prefix = "203.0.113.10/32"
    birdc_socket = "/run/bird/bird.ctl"
    [[anycast.zones]]
    region = "eu"; zone = "eu-a"; next_hop = "127.0.0.2"
    command_fifo = "/run/lifeline/eu-a.cmd"; ack_fifo = "/run/lifeline/eu-a.ack"

    [dns]                           dns: one record, the answer of the serving region
    zone = "lifeline.test."; name = "api.lifeline.test."; ttl_s = 60
    [dns.rfc2136]                   #   and/or [dns.route53] (endpoint_url, region_name)
    server = "127.0.0.1"; port = 53; key_name = "lifeline"; key_secret_file = "/etc/lifeline/tsig.secret"
    [dns.regions.eu]
    answer = ["192.0.2.10"]; failover_to = "us"

    [policy]                        the workflow's tunables (cutover.policy), all optional
    min_wait = 300; step_timeout = 30; claim_ttl = 60; headroom = 1.2; max_zonal_shift = "PT72H"
    [policy.step_timeouts]
    dns = 120                       #   Route 53 can take a minute to be INSYNC

    [[capacity.plans]]              assertion.capacity: the warm-pool plan of each region
    region = "eu"; zones = ["eu-a", "eu-b"]     #   `lifeline pool plan`'s inputs, by their names
    demand_seqs = 300; demand_tokens_per_s = 9000; context_tokens = 1500
    instance_seqs = 16; instance_tokens_per_s = 800; instance_prefill_tokens_per_s = 8000

    [istio]                         mesh: Istio VirtualService weights
    kubeconfig = "/etc/lifeline/kubeconfig"     #   or host + token_file (+ ca_file)
    [[istio.routes]]
    scope = "region:eu/zone:eu-a"; namespace = "serving"; virtual_service = "llm"
    route = "default"; destinations = ["llm.serving.svc.cluster.local/eu-a"]

Unknown keys, bad values and missing files stop start-up with
`CutoverDriverConfigError`, whose message names the file and the key
(`dns.regions.eu.failover_to: …`). Nothing is dialled at start-up: a
routing system that is down is a `cutover_driver_unavailable` step at
execute time, not a control plane that will not start.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from common.clock import Clock
from cutover.capacity import CapacityConfig
from cutover.driver_tables import (
    AnycastConfig,
    DnsConfig,
    DnsRegion,
    HaproxyConfig,
    IstioConfig,
    PolicyConfig,
    _Config,
)
from cutover.models import CutoverTier, ScopeKind, TargetState
from cutover.tiers import Scope, ScopedTierDriverAdapter, StepDriver, TierDriverAdapter

ENV_KEY = "LIFELINE_CONTROLPLANE_CUTOVER_DRIVERS_FILE"


class CutoverDriverConfigError(ValueError):
    """The drivers file is missing, unreadable or invalid; the message names the file and the key."""



class CutoverDriversConfig(_Config):
    policy: PolicyConfig | None = None
    haproxy: HaproxyConfig | None = None
    anycast: AnycastConfig | None = None
    dns: DnsConfig | None = None
    istio: IstioConfig | None = None
    capacity: CapacityConfig | None = None

    def configured_tiers(self) -> list[CutoverTier]:
        tiers = {CutoverTier.L7, CutoverTier.MESH}  # the snapshot's, always
        tiers |= {CutoverTier.ANYCAST} if self.anycast else set()
        tiers |= {CutoverTier.DNS} if self.dns else set()
        return sorted(tiers, key=list(CutoverTier).index)


def load(path: Path) -> CutoverDriversConfig:
    """Read and validate the drivers file; CutoverDriverConfigError names the file and the key."""
    where = f"{ENV_KEY}={path}"
    try:
        raw = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise CutoverDriverConfigError(f"{where}: cannot read it: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise CutoverDriverConfigError(f"{where}: not TOML: {exc}") from None
    try:
        return CutoverDriversConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"
                             for e in exc.errors(include_url=False))
        raise CutoverDriverConfigError(f"{where}: {problems}") from None


# ---------------------------------------------------------------- building the drivers


def _covers(scope: Scope, key: str) -> bool:
    """A configured scope key belongs to `scope` if it is the scope or lies inside it (a region's zones)."""
    return key == scope.key or key.startswith(scope.key + "/")


def _haproxy(config: HaproxyConfig, clock: Clock) -> StepDriver:
    from cutover.driver import L7Target
    from cutover.drivers.haproxy import HaproxyDriver, HaproxyRuntimeApi

    def targets_for(scope: Scope) -> list[L7Target]:
        refs = sorted({ref for key, refs in config.servers.items() if _covers(scope, key) for ref in refs})
        return [L7Target(backend=ref.split("/")[0], server=ref.split("/")[1]) for ref in refs]

    driver = HaproxyDriver(HaproxyRuntimeApi(config.address(), timeout_s=config.timeout_s), clock=clock)
    return TierDriverAdapter(driver, tier=CutoverTier.L7, name="haproxy", targets_for=targets_for)


def _anycast(config: AnycastConfig, clock: Clock) -> StepDriver:
    from cutover.driver import AnycastTarget
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
    return TierDriverAdapter(driver, tier=CutoverTier.ANYCAST, name="exabgp", targets_for=targets_for)


def dns_desired(regions: Mapping[str, DnsRegion], ttl_s: int) -> Callable[[Any, TargetState, Scope], Any]:
    """out: the answer of the region that takes over; in: the region's own. TTL: the configured short one."""

    def desired_for(before: Any, target_state: TargetState, scope: Scope) -> Any:
        region = regions[scope.region]
        answer = regions[region.failover_to].answer if target_state == TargetState.OUT else region.answer
        return before.model_copy(update={"values": tuple(sorted(answer)), "ttl_s": ttl_s})

    return desired_for


def _dns(config: DnsConfig, clock: Clock) -> list[StepDriver]:
    from cutover.driver import DnsTarget
    from cutover.drivers.dns import Rfc2136Driver, Route53Driver

    def targets_for(scope: Scope) -> list[DnsTarget]:
        if scope.kind != ScopeKind.REGION or scope.region not in config.regions:
            return []
        return [DnsTarget(zone=config.zone, name=config.name, rdtype=config.rdtype)]

    drivers: list[StepDriver] = []
    if config.rfc2136 is not None:
        spec = config.rfc2136
        driver = Rfc2136Driver(server=spec.server, port=spec.port, key_name=spec.key_name,
                               key_secret=spec.key_secret_file.read_text().strip(), key_algorithm=spec.key_algorithm,
                               io_timeout_s=spec.io_timeout_s, clock=clock)
        drivers.append(ScopedTierDriverAdapter(driver, tier=CutoverTier.DNS, name="rfc2136", targets_for=targets_for,
                                               desired_for=dns_desired(config.regions, config.ttl_s)))
    if config.route53 is not None:
        import boto3

        client = boto3.client("route53", endpoint_url=config.route53.endpoint_url,
                              region_name=config.route53.region_name)
        drivers.append(ScopedTierDriverAdapter(Route53Driver(client, clock=clock), tier=CutoverTier.DNS,
                                               name="route53", targets_for=targets_for,
                                               desired_for=dns_desired(config.regions, config.ttl_s)))
    return drivers


def _istio(config: IstioConfig, clock: Clock) -> StepDriver:
    from kubernetes.client import ApiClient, Configuration

    from cutover.driver import MeshTarget
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
    return TierDriverAdapter(driver, tier=CutoverTier.MESH, name="istio", targets_for=targets_for)


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
