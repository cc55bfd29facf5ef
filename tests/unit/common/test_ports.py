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
