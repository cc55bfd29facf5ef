"""The dns tier's drivers on a real BIND9 (RFC 2136 + TSIG) and on moto's Route 53 emulator.

The lab zone holds the seed's dual TTL: `api` (external, 60 s) and
`api.internal` (internal, 600 s). A target with only `name` moves the
external record; one with `internal_name` as well moves both in one write.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import dns.message
import dns.query
import pytest

from common.clock import SystemClock
from cutover.drivers.base import (
    EXTERNAL_TTL_S,
    INTERNAL_TTL_S,
    DnsState,
    DnsTarget,
    DriverRejected,
    DriverUnavailable,
    VerificationFailed,
)
from cutover.runtime import build_drivers
from cutover.drivers_file import load
from cutover.drivers.dns import Rfc2136Driver, Route53Driver
from cutover.models import StepStateJSON
from cutover.scope import Scope, ScopeKind, TargetState
from lifeline.processes import free_port
from tests.integration.cutover.conftest import REGION_A, REGION_B, dns_drivers_table
from lifeline.daemons import MotoServer, BindServer

ZONE = "lifeline.test."
EXTERNAL = DnsTarget(zone=ZONE, name="api.lifeline.test.")
INTERNAL = DnsTarget(zone=ZONE, name="api.internal.lifeline.test.")
DUAL = DnsTarget(zone=ZONE, name=EXTERNAL.name, internal_name=INTERNAL.name)
TIMEOUT = timedelta(seconds=5)


def authoritative(server: BindServer, name: str) -> tuple[list[str], int]:
    """The server's answer for `name` and its TTL, asked with a plain query (not through a driver)."""
    response = dns.query.udp(dns.message.make_query(name, "A"), server.host, port=server.port, timeout=2)
    (rrset,) = response.answer
    return sorted(r.address for r in rrset), rrset.ttl


def rfc2136(server: BindServer, **overrides: object) -> Rfc2136Driver:
    settings: dict[str, object] = dict(server=server.host, port=server.port, key_name=server.key_name,
                                       key_secret=server.key_secret, key_algorithm=server.key_algorithm)
    settings.update(overrides)
    return Rfc2136Driver(**settings)  # type: ignore[arg-type]


def test_bind_reads_the_seeded_dual_ttl_records(bind_server: BindServer) -> None:
    driver = rfc2136(bind_server)
    assert driver.read_state(EXTERNAL) == DnsState(target=EXTERNAL, values=(REGION_A,), ttl_s=EXTERNAL_TTL_S)
    assert driver.read_state(INTERNAL) == DnsState(target=INTERNAL, values=(REGION_A,), ttl_s=INTERNAL_TTL_S)


def test_bind_region_cutover_flips_the_external_answer_and_restore_flips_it_back(bind_server: BindServer) -> None:
    driver = rfc2136(bind_server)
    before = driver.read_state(EXTERNAL)
    after = before.model_copy(update={"values": (REGION_B,)})

    driver.apply(after)
    proof = driver.verify(after, TIMEOUT)

    assert proof.verified and proof.observed == after
    assert proof.measured_from == "apply" and proof.polls >= 1
    assert REGION_B in proof.evidence and "(aa)" in proof.evidence
    # Resolvers may hold the replaced answer for its TTL: the short external one.
    assert proof.client_cache_ttl_s == EXTERNAL_TTL_S
    # A target without internal_name leaves the long-TTL internal record alone.
    assert driver.read_state(INTERNAL).values == (REGION_A,)
    # A second driver (a restarted control plane) reads the same real state.
    assert rfc2136(bind_server).read_state(EXTERNAL) == after

    back = driver.restore(before, TIMEOUT)
    assert back.verified and back.observed == before
    assert rfc2136(bind_server).read_state(EXTERNAL) == before


def test_bind_region_cutover_moves_both_dual_ttl_records_with_their_ttls_and_restore_brings_both_back(
        bind_server: BindServer) -> None:
    driver = rfc2136(bind_server)
    before = driver.read_state(DUAL)
    assert before == DnsState(target=DUAL, values=(REGION_A,), ttl_s=EXTERNAL_TTL_S,
                              internal_values=(REGION_A,), internal_ttl_s=INTERNAL_TTL_S)
    after = before.model_copy(update={"values": (REGION_B,), "internal_values": (REGION_B,)})

    driver.apply(after)
    proof = driver.verify(after, TIMEOUT)

    assert proof.verified and proof.observed == after
    # Clients may hold the replaced external answer 60 s; the region's own services the internal one 600 s.
    assert (proof.client_cache_ttl_s, proof.internal_cache_ttl_s) == (EXTERNAL_TTL_S, INTERNAL_TTL_S)
    assert f"{INTERNAL.name} {INTERNAL_TTL_S} IN A {REGION_B}" in proof.evidence
    assert authoritative(bind_server, EXTERNAL.name) == ([REGION_B], EXTERNAL_TTL_S)
    assert authoritative(bind_server, INTERNAL.name) == ([REGION_B], INTERNAL_TTL_S)

    back = driver.restore(before, TIMEOUT)
    assert back.verified and back.observed == before
    assert authoritative(bind_server, EXTERNAL.name) == ([REGION_A], EXTERNAL_TTL_S)
    assert authoritative(bind_server, INTERNAL.name) == ([REGION_A], INTERNAL_TTL_S)


def test_bind_drivers_file_with_an_internal_name_moves_both_records_with_the_configured_ttls(
        bind_server: BindServer, tmp_path: Path) -> None:
    """The served path: the drivers file → the rfc2136 step driver → plan, apply, verify, roll back on BIND9."""
    path = tmp_path / "drivers.toml"
    path.write_text(dns_drivers_table(bind_server, tmp_path,
                                      internal=f'internal_name = "{INTERNAL.name}"\ninternal_ttl_s = 900'))
    (step_driver,) = build_drivers(load(path), clock=SystemClock())
    (target,) = step_driver.targets(Scope(ScopeKind.REGION, "eu", "eu"))
    before = step_driver.read_state(target)
    out = step_driver.desired(before, TargetState.OUT)
    assert (out.values, out.ttl_s, out.internal_values, out.internal_ttl_s) == (
        (REGION_B,), EXTERNAL_TTL_S, (REGION_B,), 900)

    step_driver.apply(out)
    check = step_driver.verify(out, TIMEOUT)
    assert check.verified, check.evidence
    assert check.observed == out  # read back with the step's target, its cutover scope included
    assert "scope" not in check.evidence["expected"]["target"]  # the evidence names the record, as it always did
    assert (check.evidence["client_cache_ttl_s"], check.evidence["internal_cache_ttl_s"]) == (
        EXTERNAL_TTL_S, INTERNAL_TTL_S)  # the replaced answers' TTLs, as seeded
    assert authoritative(bind_server, EXTERNAL.name) == ([REGION_B], EXTERNAL_TTL_S)
    assert authoritative(bind_server, INTERNAL.name) == ([REGION_B], 900)

    step_driver.apply(before)  # rollback: the recorded before-state
    assert step_driver.verify(before, TIMEOUT).verified
    assert authoritative(bind_server, EXTERNAL.name) == ([REGION_A], EXTERNAL_TTL_S)
    assert authoritative(bind_server, INTERNAL.name) == ([REGION_A], INTERNAL_TTL_S)


def test_bind_apply_is_idempotent(bind_server: BindServer) -> None:
    driver = rfc2136(bind_server)
    after = DnsState(target=EXTERNAL, values=(REGION_B,), ttl_s=EXTERNAL_TTL_S)
    driver.apply(after)
    driver.apply(after)
    assert driver.verify(after, TIMEOUT).observed == after


def test_bind_refuses_an_update_signed_with_the_wrong_tsig_secret(bind_server: BindServer) -> None:
    wrong = rfc2136(bind_server, key_secret="d3JvbmctYnV0LXdlbGwtZm9ybWVkLXNlY3JldC0zMmJ5dGVz")
    with pytest.raises(DriverRejected, match="TSIG"):
        wrong.apply(DnsState(target=EXTERNAL, values=(REGION_B,), ttl_s=EXTERNAL_TTL_S))
    assert rfc2136(bind_server).read_state(EXTERNAL).values == (REGION_A,)


def test_bind_refuses_an_update_outside_its_zone(bind_server: BindServer) -> None:
    foreign = DnsTarget(zone="other.test.", name="api.other.test.")
    with pytest.raises(DriverRejected, match="NOTAUTH|REFUSED"):
        rfc2136(bind_server).apply(DnsState(target=foreign, values=(REGION_B,), ttl_s=60))


def test_verify_fails_with_the_last_answer_as_evidence_when_the_record_does_not_move(
        bind_server: BindServer) -> None:
    driver = rfc2136(bind_server)
    never = DnsState(target=EXTERNAL, values=(REGION_B,), ttl_s=EXTERNAL_TTL_S)  # never applied
    with pytest.raises(VerificationFailed) as failed:
        driver.verify(never, timedelta(milliseconds=200))
    verification = failed.value.verification
    assert not verification.verified and verification.measured_from == "verify"
    assert verification.observed.values == (REGION_A,) and REGION_A in verification.evidence
    assert verification.polls >= 2


def test_bind_that_is_down_is_unavailable_not_rejected(bind_server: BindServer) -> None:
    driver = rfc2136(bind_server, io_timeout_s=0.2)
    bind_server.stop()
    with pytest.raises(DriverUnavailable):
        driver.read_state(EXTERNAL)
    with pytest.raises(DriverUnavailable):
        driver.apply(DnsState(target=EXTERNAL, values=(REGION_B,), ttl_s=EXTERNAL_TTL_S))


@pytest.fixture
def route53_emulator() -> Iterator[object]:
    server = MotoServer()
    server.start()
    try:
        import boto3

        client = boto3.client("route53", endpoint_url=server.endpoint_url, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        zone_id = client.create_hosted_zone(Name=ZONE, CallerReference="lifeline-test")["HostedZone"]["Id"]
        client.change_resource_record_sets(HostedZoneId=zone_id, ChangeBatch={"Changes": [
            {"Action": "CREATE", "ResourceRecordSet": {"Name": t.name, "Type": "A", "TTL": ttl,
                                                       "ResourceRecords": [{"Value": REGION_A}]}}
            for t, ttl in ((EXTERNAL, EXTERNAL_TTL_S), (INTERNAL, INTERNAL_TTL_S))]})
        yield client
    finally:
        server.stop()


def test_route53_emulator_region_cutover_and_restore(route53_emulator: object) -> None:
    driver = Route53Driver(route53_emulator)
    before = driver.read_state(EXTERNAL)
    assert before == DnsState(target=EXTERNAL, values=(REGION_A,), ttl_s=EXTERNAL_TTL_S)
    after = before.model_copy(update={"values": (REGION_B,)})

    driver.apply(after)
    proof = driver.verify(after, TIMEOUT)
    assert proof.verified and proof.client_cache_ttl_s == EXTERNAL_TTL_S
    assert "INSYNC" in proof.evidence
    assert Route53Driver(route53_emulator).read_state(INTERNAL).values == (REGION_A,)

    assert driver.restore(before, TIMEOUT).observed == before
    assert Route53Driver(route53_emulator).read_state(EXTERNAL) == before


def test_route53_emulator_moves_both_dual_ttl_record_sets_in_one_change_and_restores_both(
        route53_emulator: object) -> None:
    driver = Route53Driver(route53_emulator)
    before = driver.read_state(DUAL)
    assert before == DnsState(target=DUAL, values=(REGION_A,), ttl_s=EXTERNAL_TTL_S,
                              internal_values=(REGION_A,), internal_ttl_s=INTERNAL_TTL_S)
    after = before.model_copy(update={"values": (REGION_B,), "internal_values": (REGION_B,)})

    driver.apply(after)
    proof = driver.verify(after, TIMEOUT)
    assert proof.verified and proof.observed == after
    assert (proof.client_cache_ttl_s, proof.internal_cache_ttl_s) == (EXTERNAL_TTL_S, INTERNAL_TTL_S)
    reader = Route53Driver(route53_emulator)
    assert reader.read_state(EXTERNAL) == DnsState(target=EXTERNAL, values=(REGION_B,), ttl_s=EXTERNAL_TTL_S)
    assert reader.read_state(INTERNAL) == DnsState(target=INTERNAL, values=(REGION_B,), ttl_s=INTERNAL_TTL_S)

    assert driver.restore(before, TIMEOUT).observed == before
    assert Route53Driver(route53_emulator).read_state(DUAL) == before


def test_route53_emulator_unknown_zone_is_rejected(route53_emulator: object) -> None:
    with pytest.raises(DriverRejected, match="no hosted zone"):
        Route53Driver(route53_emulator).read_state(DnsTarget(zone="missing.test.", name="api.missing.test."))


def test_route53_unreachable_endpoint_is_unavailable() -> None:
    import boto3
    from botocore.config import Config

    client = boto3.client("route53", endpoint_url=f"http://127.0.0.1:{free_port()}", region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing",
                          config=Config(retries={"max_attempts": 1}, connect_timeout=0.5))
    with pytest.raises(DriverUnavailable):
        Route53Driver(client).read_state(EXTERNAL)


def test_bind_ignores_a_targets_cutover_scope_and_reads_back_the_target_it_was_given(
        bind_server: BindServer) -> None:
    scoped = EXTERNAL.model_copy(update={"scope": Scope(ScopeKind.REGION, "eu", "eu")})
    driver = rfc2136(bind_server)
    before = driver.read_state(scoped)
    assert before == DnsState(target=scoped, values=(REGION_A,), ttl_s=EXTERNAL_TTL_S)
    after = before.model_copy(update={"values": (REGION_B,)})
    driver.apply(after)
    proof = driver.verify(after, TIMEOUT)
    assert proof.verified and proof.observed == after
    assert proof.client_cache_ttl_s == EXTERNAL_TTL_S  # the answer it replaced, known by the record alone
    assert rfc2136(bind_server).read_state(EXTERNAL).values == (REGION_B,)  # one record, whoever's scope moved it
    assert driver.restore(before, TIMEOUT).verified


def test_bind_rollback_after_a_restart_from_the_stored_before_state(bind_server: BindServer) -> None:
    """The service stores a step's before-state as JSON in its row; a new process rolls back from that alone."""
    first = rfc2136(bind_server)
    before = first.read_state(EXTERNAL)
    stored = json.loads(json.dumps(StepStateJSON().process_bind_param(before, None)))
    first.apply(before.model_copy(update={"values": (REGION_B,)}))
    del first  # the control plane that made the change is gone

    restarted = rfc2136(bind_server)
    rebuilt = StepStateJSON().process_result_value(stored, None)
    assert rebuilt == before
    proof = restarted.restore(rebuilt, TIMEOUT)
    assert proof.verified and restarted.read_state(EXTERNAL).values == (REGION_A,)
