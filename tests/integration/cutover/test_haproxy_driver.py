"""The l7 tier's HAProxy driver against a real HAProxy and two loopback upstreams."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest

from cutover.drivers.base import (
    DriverRejected,
    DriverUnavailable,
    L7State,
    L7Target,
    VerificationFailed,
)
from tests.integration.cutover.conftest import HaproxyLab

TIMEOUT = timedelta(seconds=5)


def upstream_of_new_requests(lab: HaproxyLab, count: int) -> list[str]:
    """Which server each of `count` fresh connections was sent to."""
    seen = []
    for _ in range(count):
        with httpx.Client(timeout=5) as client:
            response = client.get(f"{lab.url}/id")
        assert response.status_code == 200, response.text
        seen.append(response.headers["X-Upstream"])
    return seen


def test_reads_the_configured_servers_ready_at_full_weight(haproxy_lab: HaproxyLab) -> None:
    for server in ("s1", "s2"):
        target = haproxy_lab.target(server)
        assert haproxy_lab.driver.read_state(target) == L7State(target=target, admin_state="ready", weight=100)
    assert sorted(set(upstream_of_new_requests(haproxy_lab, 4))) == ["s1", "s2"]


def test_drain_stops_new_connections_while_an_open_stream_completes(haproxy_lab: HaproxyLab) -> None:
    driver = haproxy_lab.driver
    with httpx.Client(timeout=10) as client, client.stream("GET", f"{haproxy_lab.url}/stream") as stream:
        chunks = stream.iter_raw()
        first = next(chunks)
        assert first == b"token-0\n"
        streaming_on = stream.headers["X-Upstream"]
        other = "s2" if streaming_on == "s1" else "s1"
        target = haproxy_lab.target(streaming_on)
        before = driver.read_state(target)

        drained = before.model_copy(update={"admin_state": "drain"})
        driver.apply(drained)
        proof = driver.verify(drained, TIMEOUT)

        assert proof.verified and "srv_admin_state=8" in proof.evidence
        assert driver.current_sessions(target) == 1  # the stream is still open on the drained server
        assert upstream_of_new_requests(haproxy_lab, 6) == [other] * 6
        haproxy_lab.release_streams.set()
        rest = b"".join(chunks)
    assert stream.status_code == 200
    assert first + rest == b"token-0\ntoken-1\ntoken-2\ntoken-3\n"

    back = driver.restore(before, TIMEOUT)
    assert back.verified and back.observed == before
    assert sorted(set(upstream_of_new_requests(haproxy_lab, 4))) == ["s1", "s2"]


def test_maint_and_weight_are_read_back_and_move_traffic(haproxy_lab: HaproxyLab) -> None:
    driver = haproxy_lab.driver
    s1 = haproxy_lab.target("s1")
    maint = L7State(target=s1, admin_state="maint", weight=100)
    driver.apply(maint)
    assert driver.verify(maint, TIMEOUT).observed == maint
    assert upstream_of_new_requests(haproxy_lab, 4) == ["s2"] * 4

    zero = L7State(target=s1, admin_state="ready", weight=0)
    driver.apply(zero)
    assert haproxy_lab.new_driver().read_state(s1) == zero
    assert upstream_of_new_requests(haproxy_lab, 4) == ["s2"] * 4


def test_unknown_server_is_rejected(haproxy_lab: HaproxyLab) -> None:
    ghost = L7Target(backend=haproxy_lab.haproxy.backend, server="s9")
    with pytest.raises(DriverRejected, match="No such server"):
        haproxy_lab.driver.apply(L7State(target=ghost, admin_state="drain", weight=100))
    with pytest.raises(DriverRejected, match="s9"):
        haproxy_lab.driver.read_state(ghost)


def test_verify_fails_when_the_state_never_shows(haproxy_lab: HaproxyLab) -> None:
    s2 = haproxy_lab.target("s2")
    with pytest.raises(VerificationFailed) as failed:
        haproxy_lab.driver.verify(L7State(target=s2, admin_state="drain", weight=100),
                                  timedelta(milliseconds=200))
    assert failed.value.verification.observed.admin_state == "ready"
    assert "srv_admin_state=0" in failed.value.verification.evidence


def test_haproxy_that_is_down_is_unavailable(haproxy_lab: HaproxyLab) -> None:
    haproxy_lab.haproxy.stop()
    with pytest.raises(DriverUnavailable, match="runtime API"):
        haproxy_lab.driver.read_state(haproxy_lab.target("s1"))
