"""The anycast tier's driver: real ExaBGP speakers per zone, a real BIRD 2 observing on loopback."""

from __future__ import annotations

from datetime import timedelta

import pytest

from cutover.drivers.base import AnycastState, AnycastTarget, DriverRejected, DriverUnavailable, VerificationFailed
from tests.integration.cutover.conftest import SERVICE_PREFIX, AnycastLab

TIMEOUT = timedelta(seconds=10)


def test_both_zones_announce_and_the_router_holds_both_paths(anycast_lab: AnycastLab) -> None:
    paths, text = anycast_lab.driver.observer.paths(SERVICE_PREFIX)
    assert sorted(p.next_hop for p in paths) == ["127.0.0.2", "127.0.0.3"], text
    assert sum(p.best for p in paths) == 1, text
    for target in anycast_lab.targets.values():
        assert anycast_lab.new_driver().read_state(target) == AnycastState(target=target, announced=True)


def test_withdrawing_a_zone_makes_the_other_zones_path_best_and_restore_brings_it_back(
        anycast_lab: AnycastLab) -> None:
    driver = anycast_lab.driver
    zone_a, zone_b = anycast_lab.targets["zone-a"], anycast_lab.targets["zone-b"]
    best_before = driver.best_next_hop(SERVICE_PREFIX)
    # Take out the zone whose path is best, so the router must switch.
    out, other = (zone_a, zone_b) if best_before == zone_a.next_hop else (zone_b, zone_a)
    before = driver.read_state(out)
    withdrawn = before.model_copy(update={"announced": False})

    driver.apply(withdrawn)
    proof = driver.verify(withdrawn, TIMEOUT)

    assert proof.verified and proof.measured_from == "apply"
    assert f"best via {other.next_hop}" in proof.evidence and "gone" in proof.evidence
    paths, text = driver.observer.paths(SERVICE_PREFIX)
    assert [(p.next_hop, p.best) for p in paths] == [(other.next_hop, True)], text
    assert anycast_lab.new_driver().read_state(other).announced

    back = driver.restore(before, TIMEOUT)
    assert back.verified and back.observed.announced
    assert sorted(p.next_hop for p in driver.observer.paths(SERVICE_PREFIX)[0]) == ["127.0.0.2", "127.0.0.3"]


def test_withdrawing_twice_is_idempotent(anycast_lab: AnycastLab) -> None:
    withdrawn = AnycastState(target=anycast_lab.targets["zone-b"], announced=False)
    anycast_lab.driver.apply(withdrawn)
    anycast_lab.driver.apply(withdrawn)
    assert anycast_lab.driver.verify(withdrawn, TIMEOUT).observed == withdrawn


def test_killed_speaker_loses_its_path_and_its_api_is_unavailable(anycast_lab: AnycastLab) -> None:
    target = anycast_lab.targets["zone-a"]
    anycast_lab.speakers["zone-a"].kill()
    # No write by us: the router dropped the session, and the driver reads that back.
    gone = anycast_lab.new_driver().verify(AnycastState(target=target, announced=False), TIMEOUT)
    assert gone.measured_from == "verify" and "best via 127.0.0.3" in gone.evidence
    with pytest.raises(DriverUnavailable, match="exabgp"):
        anycast_lab.driver.apply(AnycastState(target=target, announced=True))


def test_a_zone_without_a_speaker_is_rejected(anycast_lab: AnycastLab) -> None:
    stray = AnycastTarget(prefix=SERVICE_PREFIX, zone="zone-z", next_hop="127.0.0.9")
    with pytest.raises(DriverRejected, match="zone-z"):
        anycast_lab.driver.apply(AnycastState(target=stray, announced=True))


def test_verify_fails_with_the_routers_table_as_evidence(anycast_lab: AnycastLab) -> None:
    target = anycast_lab.targets["zone-a"]
    with pytest.raises(VerificationFailed) as failed:
        anycast_lab.driver.verify(AnycastState(target=target, announced=False), timedelta(milliseconds=200))
    assert failed.value.verification.observed.announced
    assert "127.0.0.2" in failed.value.verification.evidence


def test_router_that_is_down_is_unavailable(anycast_lab: AnycastLab) -> None:
    anycast_lab.router.stop()
    with pytest.raises(DriverUnavailable, match="birdc"):
        anycast_lab.driver.read_state(anycast_lab.targets["zone-a"])
