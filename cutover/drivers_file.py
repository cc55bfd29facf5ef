"""The drivers file: which routing systems cutovers drive, the workflow's policy and capacity plans; typed, read once.

`LIFELINE_CONTROLPLANE_CUTOVER_DRIVERS_FILE` names a TOML file; each table
configures one tier's driver, and a tier without one is *recorded only*
(its cutover steps change nothing and say so; `cutover.drivers.recorded_only`).
The l7 and mesh tiers through Lifeline's own snapshot are always there.
`cutover.runtime.build_runtime` builds the drivers from it; each table's
model below forbids unknown keys and fails with the key's path.

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

    [dns]                           dns: the answer of the serving region, dual TTL
    zone = "lifeline.test."; name = "api.lifeline.test."; ttl_s = 60
    internal_name = "api.internal.lifeline.test."; internal_ttl_s = 600   # optional, moved with name
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

import ipaddress
import tomllib
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FilePath,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from controlplane.types import Name
from cutover.capacity import CapacityConfig
from cutover.drivers.base import EXTERNAL_TTL_S, INTERNAL_TTL_S
from contract.routing_tier import RoutingTier
from cutover.policy import CutoverPolicy

ENV_KEY = "LIFELINE_CONTROLPLANE_CUTOVER_DRIVERS_FILE"

ScopeKey = Annotated[str, StringConstraints(pattern=r"^region:[A-Za-z0-9._-]+(/(zone|instance):[A-Za-z0-9._-]+)?$")]
ServerRef = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]+/[A-Za-z0-9._-]+$")]
AbsoluteName = Annotated[str, StringConstraints(pattern=r"^([A-Za-z0-9_-]+\.)+$", max_length=253)]


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HaproxyConfig(_Config):
    runtime_api: str = Field(description="host:port of `stats socket ipv4@…`, or an absolute UNIX socket path")
    timeout_s: float = Field(2.0, gt=0, le=60)
    servers: dict[ScopeKey, list[ServerRef]] = Field(min_length=1)

    @field_validator("runtime_api")
    @classmethod
    def _address(cls, value: str) -> str:
        if value.startswith("/"):
            return value
        host, _, port = value.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("must be host:port (port 1-65535) or an absolute UNIX socket path")
        return value

    def address(self) -> tuple[str, int] | Path:
        if self.runtime_api.startswith("/"):
            return Path(self.runtime_api)
        host, _, port = self.runtime_api.rpartition(":")
        return (host, int(port))


class AnycastZone(_Config):
    region: Name
    zone: Name
    next_hop: str
    command_fifo: Path
    ack_fifo: Path

    @field_validator("next_hop")
    @classmethod
    def _ip(cls, value: str) -> str:
        return str(ipaddress.ip_address(value))


class AnycastConfig(_Config):
    prefix: str
    birdc_socket: Path
    birdc: str = "birdc"
    ack_timeout_s: float = Field(2.0, gt=0, le=60)
    zones: list[AnycastZone] = Field(min_length=1)

    @field_validator("prefix")
    @classmethod
    def _network(cls, value: str) -> str:
        return str(ipaddress.ip_network(value))

    @model_validator(mode="after")
    def _zones_unique(self) -> AnycastConfig:
        names = [z.zone for z in self.zones]
        if len(set(names)) != len(names):
            raise ValueError("zones: each zone may announce once (zone names must be unique)")
        return self


class Rfc2136Config(_Config):
    server: str
    port: int = Field(53, ge=1, le=65535)
    key_name: str
    key_secret_file: FilePath = Field(description="the TSIG secret (base64), alone in a file")
    key_algorithm: Literal["hmac-sha256", "hmac-sha512", "hmac-sha384", "hmac-sha224"] = "hmac-sha256"
    io_timeout_s: float = Field(2.0, gt=0, le=60)


class Route53Config(_Config):
    endpoint_url: str | None = Field(None, description="unset: AWS; moto's server in tests")
    region_name: str = "us-east-1"


class DnsRegion(_Config):
    answer: list[str] = Field(min_length=1, description="the record's values while this region serves")
    failover_to: Name = Field(description="the region whose answer the record takes when this one is out")


class DnsConfig(_Config):
    """`[dns]`: the seed's dual TTL (cutover/drivers/dns.py says what a cutover does to each record)."""

    zone: AbsoluteName
    name: AbsoluteName
    rdtype: Literal["A", "AAAA", "CNAME"] = "A"
    ttl_s: int = Field(EXTERNAL_TTL_S, ge=1, le=86400, description="the short TTL of `name`, the external record")
    internal_name: AbsoluteName | None = Field(
        None, description="the long-TTL record of the region's own services, moved with `name`; unset: not managed")
    internal_ttl_s: int = Field(INTERNAL_TTL_S, ge=1, le=86400,
                                description="its TTL: how long internal clients may keep the previous answer")
    rfc2136: Rfc2136Config | None = None
    route53: Route53Config | None = None
    regions: dict[Name, DnsRegion] = Field(min_length=2)

    @model_validator(mode="after")
    def _consistent(self) -> DnsConfig:
        if self.rfc2136 is None and self.route53 is None:
            raise ValueError("configure [dns.rfc2136] or [dns.route53] (or both)")
        if not self.name.endswith(self.zone):
            raise ValueError(f"name {self.name!r} is not in zone {self.zone!r}")
        if self.internal_name is None:
            if "internal_ttl_s" in self.model_fields_set:
                raise ValueError("internal_ttl_s is set but internal_name is not: there is no internal record")
        else:
            # One zone, so both records move in one UPDATE / change batch.
            if not self.internal_name.endswith(self.zone):
                raise ValueError(f"internal_name {self.internal_name!r} is not in zone {self.zone!r}")
            if self.internal_name == self.name:
                raise ValueError("internal_name must differ from name (the internal record is its own)")
            if self.internal_ttl_s < self.ttl_s:
                raise ValueError(f"internal_ttl_s ({self.internal_ttl_s}) is shorter than ttl_s ({self.ttl_s}): "
                                 "the internal record is the long one of the dual TTL")
        for region, spec in self.regions.items():
            if spec.failover_to == region or spec.failover_to not in self.regions:
                raise ValueError(f"regions.{region}.failover_to: {spec.failover_to!r} is not another configured region")
        return self


class IstioRoute(_Config):
    scope: ScopeKey
    namespace: Name
    virtual_service: Name
    route: Name
    destinations: list[str] = Field(min_length=1, description="host or host/subset, the scope's")


class IstioConfig(_Config):
    kubeconfig: FilePath | None = None
    host: str | None = None
    token_file: FilePath | None = None
    ca_file: FilePath | None = None
    verify_ssl: bool = True
    api_version: Literal["v1", "v1beta1"] = "v1"
    require_reconciled: bool = Field(True, description="verify istiod's Reconciled status, not the spec alone")
    routes: list[IstioRoute] = Field(min_length=1)

    @model_validator(mode="after")
    def _one_way_in(self) -> IstioConfig:
        if (self.kubeconfig is None) == (self.host is None):
            raise ValueError("set exactly one of kubeconfig and host")
        return self


PositiveDuration = Annotated[timedelta, Field(gt=timedelta(0), le=timedelta(days=7))]


class PolicyConfig(_Config):
    """`[policy]`: the workflow's tunables (cutover.policy.CutoverPolicy); durations in seconds or ISO 8601."""

    min_wait: timedelta = Field(timedelta(minutes=5), ge=timedelta(0), le=timedelta(days=1))
    claim_ttl: PositiveDuration = timedelta(seconds=60)
    step_timeout: PositiveDuration = timedelta(seconds=30)
    step_timeouts: dict[RoutingTier, PositiveDuration] = Field(default_factory=dict,
                                                               description="per tier, over step_timeout")
    headroom: float = Field(1.2, ge=1.0, le=10.0)
    max_zonal_shift: timedelta = Field(timedelta(hours=72), gt=timedelta(0), le=timedelta(hours=72),
                                       description="ARC's rule: never more than 72 h")
    expiry_interval: PositiveDuration = timedelta(seconds=5)

    def build(self) -> CutoverPolicy:
        return CutoverPolicy(min_wait=self.min_wait, claim_ttl=self.claim_ttl, step_timeout=self.step_timeout,
                             headroom=self.headroom, max_zonal_shift=self.max_zonal_shift,
                             expiry_interval=self.expiry_interval,
                             tier_step_timeouts={t.value: d for t, d in self.step_timeouts.items()})


# ---------------------------------------------------------------- the file


class CutoverDriverConfigError(ValueError):
    """The drivers file is missing, unreadable or invalid; the message names the file and the key."""


class CutoverDriversConfig(_Config):
    policy: PolicyConfig | None = None
    haproxy: HaproxyConfig | None = None
    anycast: AnycastConfig | None = None
    dns: DnsConfig | None = None
    istio: IstioConfig | None = None
    capacity: CapacityConfig | None = None

    def configured_tiers(self) -> list[RoutingTier]:
        tiers = {RoutingTier.L7, RoutingTier.MESH}  # the snapshot's, always
        tiers |= {RoutingTier.ANYCAST} if self.anycast else set()
        tiers |= {RoutingTier.DNS} if self.dns else set()
        return sorted(tiers, key=list(RoutingTier).index)


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
