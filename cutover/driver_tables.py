"""The drivers file's tables, one typed model per routing system (and `[policy]`), read by `cutover.driver_config`.

Split from driver_config.py (which loads the file and builds the drivers):
each model forbids unknown keys and fails with the key's path, so a bad
file stops start-up naming it.
"""

from __future__ import annotations

import ipaddress
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, FilePath, StringConstraints, field_validator, model_validator

from controlplane.types import Name
from cutover.models import CutoverTier
from cutover.policy import CutoverPolicy

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
    zone: AbsoluteName
    name: AbsoluteName
    rdtype: Literal["A", "AAAA", "CNAME"] = "A"
    ttl_s: int = Field(60, ge=1, le=86400, description="the short, external TTL the cutover moves (dual TTL)")
    rfc2136: Rfc2136Config | None = None
    route53: Route53Config | None = None
    regions: dict[Name, DnsRegion] = Field(min_length=2)

    @model_validator(mode="after")
    def _consistent(self) -> DnsConfig:
        if self.rfc2136 is None and self.route53 is None:
            raise ValueError("configure [dns.rfc2136] or [dns.route53] (or both)")
        if not self.name.endswith(self.zone):
            raise ValueError(f"name {self.name!r} is not in zone {self.zone!r}")
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
    step_timeouts: dict[CutoverTier, PositiveDuration] = Field(default_factory=dict,
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
