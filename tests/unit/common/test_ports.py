"""free_port: below the ephemeral range, never a port something listens on, never handed out twice."""

from __future__ import annotations

import socket

import pytest

from common import ports


def test_ports_come_from_below_the_kernels_ephemeral_range() -> None:
    start = ports._ephemeral_start()
    handed = [ports.free_port() for _ in range(100)]
    assert all(ports._LOWEST <= port < start for port in handed)
    assert len(set(handed)) == len(handed)


def test_a_port_with_a_listener_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))  # an ephemeral port is fine for the squatter; the draw is forced onto it
        busy.listen()
        taken = busy.getsockname()[1]
        draws = iter([taken, 24_681])
        monkeypatch.setattr(ports.random, "randint", lambda low, high: next(draws))
        monkeypatch.setattr(ports, "_ephemeral_start", lambda: 65_535)
        monkeypatch.setattr(ports, "_handed_out", set())
        assert ports.free_port() == 24_681


def test_parallel_starters_draw_from_disjoint_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_ephemeral_start", lambda: 32_768)
    slices = []
    for index in range(3):
        monkeypatch.setenv("LIFELINE_PORT_SLICE", f"{index}/3")
        slices.append(ports.port_range())
        assert all(slices[-1][0] <= ports.free_port() <= slices[-1][1] for _ in range(20))
    assert slices[0][0] == ports._LOWEST and slices[-1][1] <= 32_767
    assert all(a[1] < b[0] for a, b in zip(slices, slices[1:], strict=False))


@pytest.mark.parametrize("value", ["2/2", "x/3", "1", "-1/3"])
def test_a_malformed_slice_is_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("LIFELINE_PORT_SLICE", value)
    with pytest.raises(ValueError, match="LIFELINE_PORT_SLICE"):
        ports.port_range()
