"""The served control plane's driver settings: a TOML file, typed, that names the key it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy.dialects import sqlite

from common.clock import ManualClock
from contract.routing_tier import RoutingTier
from cutover.drivers.base import DnsState
from cutover.drivers_file import CutoverDriverConfigError, load
from cutover.models import StepStateJSON
from cutover.scope import Scope, ScopeKind, TargetState
from cutover.runtime import build_drivers

EU, EU_A, ENGINE = (Scope(ScopeKind.REGION, "eu", "eu"), Scope(ScopeKind.ZONE, "eu", "eu-a"),
                    Scope(ScopeKind.INSTANCE, "eu", "engine-7"))


def _full(tmp_path: Path) -> str:
    (tmp_path / "tsig.secret").write_text("c2VjcmV0\n")
    (tmp_path / "token").write_text("abc\n")
    return f"""
[haproxy]
runtime_api = "127.0.0.1:9999"
[haproxy.servers]
"region:eu/zone:eu-a" = ["llm/s1"]
"region:eu/instance:engine-7" = ["llm/s3"]
"region:us/zone:us-a" = ["llm/s2"]

[anycast]
prefix = "203.0.113.10/32"
birdc_socket = "{tmp_path}/bird.ctl"
[[anycast.zones]]
region = "eu"
zone = "eu-a"
next_hop = "127.0.0.2"
command_fifo = "{tmp_path}/a.cmd"
ack_fifo = "{tmp_path}/a.ack"
[[anycast.zones]]
region = "eu"
zone = "eu-b"
next_hop = "127.0.0.3"
command_fifo = "{tmp_path}/b.cmd"
ack_fifo = "{tmp_path}/b.ack"

[dns]
zone = "lifeline.test."
name = "api.lifeline.test."
[dns.rfc2136]
server = "127.0.0.1"
port = 5353
key_name = "lifeline"
key_secret_file = "{tmp_path}/tsig.secret"
[dns.route53]
endpoint_url = "http://127.0.0.1:5000"
[dns.regions.eu]
answer = ["192.0.2.10"]
failover_to = "us"
[dns.regions.us]
answer = ["198.51.100.10"]
failover_to = "eu"

[istio]
host = "https://kube.example:6443"
token_file = "{tmp_path}/token"
[[istio.routes]]
scope = "region:eu/zone:eu-a"
namespace = "serving"
virtual_service = "llm"
route = "default"
destinations = ["llm.serving.svc.cluster.local/eu-a"]
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "drivers.toml"
    path.write_text(text)
    return path


def test_every_tier_builds_from_the_file_and_maps_scopes_to_targets(tmp_path: Path) -> None:
    config = load(_write(tmp_path, _full(tmp_path)))
    assert config.configured_tiers() == [RoutingTier.L7, RoutingTier.MESH, RoutingTier.ANYCAST, RoutingTier.DNS]
    drivers = {(d.tier, d.name): d for d in build_drivers(config, clock=ManualClock())}
    assert sorted((t.value, n) for t, n in drivers) == [
        ("anycast", "exabgp"), ("dns", "rfc2136"), ("dns", "route53"), ("l7", "haproxy"), ("mesh", "istio")]
    haproxy = drivers[(RoutingTier.L7, "haproxy")]
    assert [t.server for t in haproxy.targets(EU)] == ["s1", "s3"]  # a region covers its zones and instances
    assert [t.server for t in haproxy.targets(EU_A)] == ["s1"]
    assert [t.server for t in haproxy.targets(ENGINE)] == ["s3"]
    anycast = drivers[(RoutingTier.ANYCAST, "exabgp")]
    assert [t.zone for t in anycast.targets(EU)] == ["eu-a", "eu-b"]
    assert [t.next_hop for t in anycast.targets(EU_A)] == ["127.0.0.2"]
    assert anycast.targets(ENGINE) == []
    dns = drivers[(RoutingTier.DNS, "rfc2136")]
    (target,) = dns.targets(EU)
    assert target.name == "api.lifeline.test." and target.scope == EU
    assert dns.targets(EU_A) == []
    assert str(drivers[(RoutingTier.DNS, "rfc2136")].driver.key_name) == "lifeline."
    assert [t.route for t in drivers[(RoutingTier.MESH, "istio")].targets(EU_A)] == ["default"]


def test_dns_out_is_the_takeover_regions_answer_with_the_short_ttl(tmp_path: Path) -> None:
    config = load(_write(tmp_path, _full(tmp_path)))
    dns = next(d for d in build_drivers(config, clock=ManualClock()) if d.name == "rfc2136")
    (target,) = dns.targets(EU)
    before = DnsState(target=target, values=("192.0.2.10",), ttl_s=600)
    out = dns.desired(before, TargetState.OUT)
    assert (out.values, out.ttl_s, out.target) == (("198.51.100.10",), 60, target)
    assert dns.desired(out, TargetState.IN).values == ("192.0.2.10",)


def test_dns_without_an_internal_name_stores_the_same_target_and_state_as_before(tmp_path: Path) -> None:
    config = load(_write(tmp_path, _full(tmp_path)))
    dns = next(d for d in build_drivers(config, clock=ManualClock()) if d.name == "rfc2136")
    (target,) = dns.targets(EU)
    assert sorted(target.model_dump(mode="json")) == ["name", "rdtype", "scope", "tier", "zone"]
    before = DnsState(target=target, values=("192.0.2.10",), ttl_s=60)
    assert sorted(dns.desired(before, TargetState.OUT).model_dump(mode="json")) == ["target", "tier", "ttl_s", "values"]


def _dual(tmp_path: Path, lines: str) -> str:
    return _full(tmp_path).replace('name = "api.lifeline.test."', f'name = "api.lifeline.test."\n{lines}', 1)


def test_dns_internal_name_moves_with_the_external_record_at_its_long_ttl(tmp_path: Path) -> None:
    config = load(_write(tmp_path, _dual(tmp_path, 'internal_name = "api.internal.lifeline.test."')))
    assert config.dns is not None
    assert (config.dns.ttl_s, config.dns.internal_ttl_s) == (60, 600)  # the seed's defaults
    dns = next(d for d in build_drivers(config, clock=ManualClock()) if d.name == "route53")
    (target,) = dns.targets(EU)
    assert target.internal_name == "api.internal.lifeline.test."
    before = DnsState(target=target, values=("192.0.2.10",), ttl_s=60, internal_values=("192.0.2.10",),
                      internal_ttl_s=600)
    out = dns.desired(before, TargetState.OUT)
    assert (out.values, out.ttl_s, out.internal_values, out.internal_ttl_s) == (
        ("198.51.100.10",), 60, ("198.51.100.10",), 600)
    back = dns.desired(out, TargetState.IN)
    assert (back.values, back.internal_values) == (("192.0.2.10",), ("192.0.2.10",))


def test_dns_ttls_are_configurable(tmp_path: Path) -> None:
    config = load(_write(tmp_path, _dual(tmp_path, 'ttl_s = 30\ninternal_name = "api.internal.lifeline.test."\n'
                                                   "internal_ttl_s = 3600")))
    assert config.dns is not None
    assert (config.dns.ttl_s, config.dns.internal_ttl_s) == (30, 3600)


@pytest.mark.parametrize(("lines", "key"), [
    ('internal_name = "api.internal.other.test."', "internal_name 'api.internal.other.test.' is not in zone"),
    ('internal_name = "api.lifeline.test."', "internal_name must differ from name"),
    ('internal_name = "api.internal"', "dns.internal_name: String should match pattern"),
    ('internal_name = "api.internal.lifeline.test."\ninternal_ttl_s = 30',
     "internal_ttl_s (30) is shorter than ttl_s (60)"),
    ('internal_name = "api.internal.lifeline.test."\ninternal_ttl_s = 0', "dns.internal_ttl_s: Input should be"),
    ('internal_name = "api.internal.lifeline.test."\ninternal_ttl_s = "ten minutes"',
     "dns.internal_ttl_s: Input should be a valid integer"),
    ("internal_ttl_s = 600", "internal_ttl_s is set but internal_name is not"),
    ("ttl_s = 0", "dns.ttl_s: Input should be"),
])
def test_a_bad_dual_ttl_stops_start_up_naming_the_key(tmp_path: Path, lines: str, key: str) -> None:
    path = _write(tmp_path, _dual(tmp_path, lines))
    with pytest.raises(CutoverDriverConfigError) as refused:
        load(path)
    message = str(refused.value)
    assert message.startswith(f"LIFELINE_CONTROLPLANE_CUTOVER_DRIVERS_FILE={path}: ") and key in message


def test_a_stored_dns_state_is_refused_when_its_internal_record_is_half_there() -> None:
    target = {"tier": "dns", "zone": "lifeline.test.", "name": "api.lifeline.test.",
              "internal_name": "api.internal.lifeline.test."}
    column = StepStateJSON()  # how a step's row is loaded
    with pytest.raises(ValidationError, match="internal_values and internal_ttl_s"):
        column.process_result_value({"tier": "dns", "target": target, "values": ["192.0.2.10"], "ttl_s": 60},
                                    sqlite.dialect())
    with pytest.raises(ValidationError, match="internal_values and internal_ttl_s"):
        column.process_result_value({"tier": "dns", "target": {**target, "internal_name": None}, "values": [],
                                     "ttl_s": 0, "internal_values": [], "internal_ttl_s": 0}, sqlite.dialect())


def test_an_empty_file_configures_only_the_snapshot_tiers(tmp_path: Path) -> None:
    config = load(_write(tmp_path, ""))
    assert config.configured_tiers() == [RoutingTier.L7, RoutingTier.MESH]
    assert build_drivers(config, clock=ManualClock()) == []


@pytest.mark.parametrize(("old", "new", "key"), [
    ('runtime_api = "127.0.0.1:9999"', 'runtime_api = "127.0.0.1"', "haproxy.runtime_api"),
    ('"region:eu/zone:eu-a" = ["llm/s1"]', '"eu-a" = ["llm/s1"]', "haproxy.servers.eu-a.[key]"),
    ('"region:eu/zone:eu-a" = ["llm/s1"]', '"region:eu/zone:eu-a" = ["s1"]', "haproxy.servers.region:eu/zone:eu-a.0"),
    ('prefix = "203.0.113.10/32"', 'prefix = "203.0.113.10/33"', "anycast.prefix"),
    ('next_hop = "127.0.0.3"', 'next_hop = "not-an-ip"', "anycast.zones.1.next_hop"),
    ('zone = "eu-b"', 'zone = "eu-a"', "anycast: Value error, zones: each zone may announce once"),
    ('failover_to = "eu"', 'failover_to = "us"', "dns: Value error, regions.us.failover_to"),
    ('port = 5353', 'port = 0', "dns.rfc2136.port"),
    ('key_secret_file = "', 'key_secret_file = "/nonexistent', "dns.rfc2136.key_secret_file"),
    ('name = "api.lifeline.test."', 'name = "api.other.test."', "is not in zone"),
    ('[istio]\nhost = "https://kube.example:6443"', '[istio]\nkubeconfig = "/nonexistent"', "istio.kubeconfig"),
    ('route = "default"', 'route = "default"\nweight = 3', "istio.routes.0.weight: Extra inputs"),
    ('[dns.rfc2136]', '[dns.bind]', "dns.bind: Extra inputs"),
])
def test_a_bad_drivers_file_stops_start_up_naming_the_key(tmp_path: Path, old: str, new: str, key: str) -> None:
    text = _full(tmp_path)
    assert old in text
    path = _write(tmp_path, text.replace(old, new, 1))
    with pytest.raises(CutoverDriverConfigError) as refused:
        load(path)
    message = str(refused.value)
    assert message.startswith(f"LIFELINE_CONTROLPLANE_CUTOVER_DRIVERS_FILE={path}: ") and key in message


def test_a_missing_or_broken_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(CutoverDriverConfigError, match="cannot read it"):
        load(tmp_path / "absent.toml")
    with pytest.raises(CutoverDriverConfigError, match="not TOML"):
        load(_write(tmp_path, "[haproxy\n"))


def test_the_policy_table_sets_the_workflows_tunables_and_per_tier_step_timeouts(tmp_path: Path) -> None:
    from datetime import timedelta

    config = load(_write(tmp_path, '[policy]\nmin_wait = "PT1M"\nstep_timeout = 20\n'
                                   '[policy.step_timeouts]\ndns = 120\n'))
    policy = config.policy.build()
    assert (policy.min_wait, policy.step_timeout) == (timedelta(minutes=1), timedelta(seconds=20))
    assert policy.step_timeout_for("dns") == timedelta(seconds=120)
    assert policy.step_timeout_for("l7") == timedelta(seconds=20)
    assert policy.max_zonal_shift == timedelta(hours=72) and policy.headroom == 1.2
    assert load(_write(tmp_path, "")).policy is None


@pytest.mark.parametrize(("text", "key"), [
    ('[policy]\nmax_zonal_shift = "PT73H"\n', "policy.max_zonal_shift"),
    ("[policy]\nstep_timeout = 0\n", "policy.step_timeout"),
    ("[policy]\nheadroom = 0.5\n", "policy.headroom"),
    ("[policy.step_timeouts]\ncarrier-pigeon = 5\n", "policy.step_timeouts.carrier-pigeon.[key]"),
    ("[policy]\nmin_wait = \"soon\"\n", "policy.min_wait"),
])
def test_a_bad_policy_names_its_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(CutoverDriverConfigError, match=key.replace(".", r"\.").replace("[", r"\[").replace("]", r"\]")):
        load(_write(tmp_path, text))


# ------------------------------------------------------------------ capacity: the warm-pool plan per region

CAPACITY = """
[[capacity.plans]]
region = "eu"
zones = ["eu-a", "eu-b"]
demand_seqs = 300
demand_tokens_per_s = 100
context_tokens = 100
instance_seqs = 10
instance_tokens_per_s = 1000
instance_prefill_tokens_per_s = 10000
[[capacity.plans]]
region = "us"
zones = "us-a"
tier = "cold"
demand_seqs = 100
demand_tokens_per_s = 100
context_tokens = 100
instance_seqs = 10
instance_tokens_per_s = 1000
instance_prefill_tokens_per_s = 10000
"""


def test_capacity_plans_give_the_assertion_the_warm_pool_plans_figures(tmp_path: Path) -> None:
    from contract.pool_plan import PlanInputs
    from warm_pool.capacity import plan_inputs

    config = load(_write(tmp_path, CAPACITY))
    assert config.capacity is not None
    capacity = config.capacity.build()
    us = plan_inputs(PlanInputs(region="us", zones=["us-a"], tier="cold", demand_seqs=100, demand_tokens_per_s=100,
                                context_tokens=100, instance_seqs=10, instance_tokens_per_s=1000,
                                instance_prefill_tokens_per_s=10000))
    # eu out: only us's serving + warm instances are left, for both regions' demand
    assert capacity.capacity_after([EU]) == ((us.serving + us.warm) * 10, 400)
    everything, _ = capacity.capacity_after([])
    less, _ = capacity.capacity_after([EU_A])
    assert 0 < less < everything
    assert load(_write(tmp_path, "")).capacity is None


@pytest.mark.parametrize(("old", "new", "key"), [
    ("instance_seqs = 10\ninstance_tokens_per_s = 1000\ninstance_prefill_tokens_per_s = 10000\n[[",
     "instance_seqs = 0\ninstance_tokens_per_s = 1000\ninstance_prefill_tokens_per_s = 10000\n[[",
     "capacity.plans.0: Value error, instance_seqs must be"),
    ('zones = ["eu-a", "eu-b"]', 'zones = ["eu-a"]', "capacity.plans.0: Value error, zones:"),
    ('region = "us"', 'region = "eu"', "capacity.plans: Value error, one plan per region"),
    ('tier = "cold"', 'tier = "cold"\ncolour = "blue"', "capacity.plans.1.colour: Extra inputs"),
    ('region = "us"', 'region = "u s"', "capacity.plans.1.region"),
])
def test_a_bad_capacity_plan_stops_start_up_naming_the_key(tmp_path: Path, old: str, new: str, key: str) -> None:
    assert old in CAPACITY
    with pytest.raises(CutoverDriverConfigError) as refused:
        load(_write(tmp_path, CAPACITY.replace(old, new, 1)))
    assert key in str(refused.value)
